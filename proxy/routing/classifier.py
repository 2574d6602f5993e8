"""Cheap rule-based classification of an OpenAI request body into a task class."""

from __future__ import annotations

import re
import string
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Final, TypeGuard

from proxy.tasks import TASK_CLASSES, TaskClass

__all__ = ["TASK_CLASSES", "TaskClass", "TaskClassifier"]

# Scan bounds: enough to see the instruction and a representative slice of any payload, while
# keeping a 200 KB request about as cheap as a 2 KB one.
_USER_HEAD: Final = 8_000
_USER_TAIL: Final = 4_000
_SCORE_HEAD: Final = 3_000
_SCORE_TAIL: Final = 1_000
_SYSTEM_HEAD: Final = 2_000
_HISTORY_MESSAGES: Final = 4
_HISTORY_HEAD: Final = 1_000
# Instructions sit at the start or the end of a message, around the pasted payload.
_INSTR_HEAD: Final = 600
_INSTR_TAIL: Final = 400
# An instruction longer than this is a conversation, not a short order about a payload.
_MAX_INSTRUCTION: Final = 400
# Below this many characters there is nothing worth "repeating"; short quoted phrases
# ("how do you say 'thank you'") are ordinary questions.
_MIN_PAYLOAD: Final = 150
_MIN_PAYLOAD_LINES: Final = 6
_MIN_CONTEXT_PAYLOAD: Final = 200
_CODE_THRESHOLD: Final = 2
_SYSTEM_CACHE_SIZE: Final = 256
# Occurrences of one trigger word tried per text; the first few decide in practice.
_MAX_OCCURRENCES: Final = 4

# Tokens are runs between punctuation and spaces; "+", "#" and "_" stay so that c++, c# and
# snake_case survive.  bytes.translate + split is several times cheaper than a regex findall,
# and than str.translate, which is slow on non-ASCII text.
_ASCII_PUNCT: Final = bytes(c for c in string.punctuation.encode() if c not in b"+#_")
_TOKEN_TABLE: Final = bytes.maketrans(_ASCII_PUNCT, b" " * len(_ASCII_PUNCT))
_UNICODE_PUNCT: Final = "“”‘’«»–—…¿¡·"


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


class _Index:
    """Phrases by their first token, so that only phrases whose first word occurs are searched."""

    __slots__ = ("cues", "keys")

    def __init__(self, phrases: Iterable[str]) -> None:
        cues: dict[str, list[str]] = {}
        for phrase in phrases:
            key = phrase.encode().translate(_TOKEN_TABLE).decode().split()[0]
            cues.setdefault(key, []).append(phrase)
        self.cues = {key: tuple(group) for key, group in cues.items()}
        self.keys = frozenset(self.cues)

    def candidates(self, tokens: frozenset[str]) -> list[tuple[str, ...]]:
        return [self.cues[key] for key in tokens & self.keys]


# Distinct words that point to code; 2 = rarely anything but software, 1 = ambiguous alone
# ("class", "code", "java") and only tips the balance together with other evidence.
_CODE_WORDS: Final[dict[str, int]] = {
    **dict.fromkeys(
        _words(
            # languages, frameworks and libraries
            """python javascript typescript js ts tsx jsx golang kotlin c++ c# php sql
            postgresql postgres mysql sqlite mongodb redis bash zsh powershell haskell scala
            perl lua dart html css react vue angular svelte django flask fastapi pandas numpy
            matplotlib sklearn pytorch tensorflow node nodejs docker dockerfile kubernetes k8s
            terraform regex regexp json yaml toml xml api apis http https graphql grpc jest
            pytest unittest sqlalchemy asyncio tokio serde clap pygame latex vba linq cpython
            jvm jupyter tailwind jquery laravel symfony nestjs nuxt redux babel eslint prettier
            mypy ruff pylint junit yarn pnpm deno"""
            # tools and commands
            """ git github gitlab npm pip conda venv virtualenv cargo maven gradle cmake gcc
            clang makefile cli ide vscode vim emacs tmux ssh chmod chown sudo curl wget grep
            sed awk cron crontab systemd systemctl nginx webpack vite stdin stdout stderr
            localhost repo codebase ci"""
            # keywords, identifiers and algorithm names that are not ordinary words
            """ const enum struct typedef namespace nullptr elif println printf malloc boolean
            varchar uuid base64 utf hashmap hashtable quicksort mergesort dijkstra fizzbuzz bfs
            dfs goroutine goroutines implement implementa implementiere implémente"""
        ),
        2,
    ),
    **dict.fromkeys(
        _words(
            """function functions method methods class classes script scripts code coding
            program programming programmer bug bugs debug debugging compile compiler compiles
            variable variables loop recursion recursive algorithm endpoint endpoints query
            queries library module modules snippet implementation refactor commit deploy
            server database backend frontend integer string strings array arrays dict
            dictionary null undefined exception traceback syntax parse parser runtime thread
            threads async await callback lambda terminal fixture controller crud component
            hook decorator timeit benchmark unix linux java rust swift ruby shell interface
            excel formula spreadsheet migration migrations schema complexity pointer pointers
            app apps unicode ascii fibonacci palindrome pseudocode funzione funzioni classe
            classi metodo metodi codice programma variabile dizionario dizionari stringa
            eccezione libreria ciclo función funciones código clase método biblioteca fonction
            fonctions méthode programme bibliothèque funktion funktionen klasse methode programm
            skript codebeispiel closure"""
        ),
        1,
    ),
}

# Words that say the output is narrative, or that a code-ish word means something else
# (python the snake, Java the island, dress code).
_PROSE_WORDS: Final = _words(
    """story stories poem poems poetry sonnet haiku limerick novel essay letter email mail
    toast speech biography tale fairy lyrics song recipe snake snakes reptile zoo pet pets
    captivity island temple trip itinerary holiday vacation weekend kids children family
    daughter son mum mom dad grandma party restaurant history historical feelings feel book
    books movie film announcement backstory wedding birthday racconto racconti poesia favola
    lettera discorso biografia storia viaggio ricetta vacanza bambini famiglia figlia figlio
    cuento poema carta historia receta viaje hija hijo histoire poème lettre conte voyage fille
    fils geschichte gedicht brief rede kurzgeschichte reise tochter sohn"""
)

# The object an edit verb points at: the pasted payload, or the previous turn.
_DEICTIC_WORDS: Final = _words(
    """this these that those it them following below above my questo questa questi queste
    quest seguente lo la este esta estos estas siguiente ce cet cette ces suivant diese diesen
    dieser dieses diesem folgende folgenden"""
)
_DEICTIC: Final = (
    r"(?:this|these|that|those|it|them|the following|below|above|my|questo|questa|questi"
    r"|queste|quest'|il seguente|la seguente|lo|la|este|esta|estos|estas|el siguiente|ce"
    r"|cet|cette|ces|suivant|diese[nmrs]?|folgenden?)\b"
)

# Echo rules.  Each regex starts with its trigger word and is only tried, with .match, where
# that word occurs; (triggers, regex, strong).  Weak rules are generic edit verbs that count
# only when nothing suggests a bug hunt.
_ECHO_RULES: Final[tuple[tuple[str, str, bool], ...]] = (
    # verbs that by themselves mean "give me this text back, transformed"
    (
        """rewrite rephrase reword paraphrase proofread copyedit reformat reindent refactor
        rename transliterate redact anonymize anonymise censor alphabetize alphabetise reorder
        modernize modernise simplify restructure reorganize reorganise condense localize
        localise normalize normalise standardize standardise prettify beautify minify convert
        umschreiben corrige corriges corrigez renderlo renderla renderli rendilo rendila
        rendili""",
        r"\w+",
        True,
    ),
    # verbs that transform only when aimed at the payload ("convert this", "put these into")
    (
        """transform turn put port migrate upgrade format sort polish adjust swap split metti
        mettete trasforma converti sistema sistemare sistemi convierte transforma pon mets
        mettez transforme convertis setze konvertiere wandle verwandle""",
        r"\w+\b[^.\n?]{0,40}?\b" + _DEICTIC,
        True,
    ),
    ("write", r"write (?:this|it|these|that|the following)\b", True),
    # form-only edits, whatever verb introduces them ("a once-over for typos")
    (
        """fix correct clean tidy improve sistema sistemare check""",
        r"\w+\b[^.\n]{0,30}\b(?:grammar|spelling|typos?|punctuation|mistakes|indentation"
        r"|formatting|format|wording|style|english|italian|capitali[sz]ation|punteggiatura"
        r"|grammatica|ortografia|ortografía|orthographe|rechtschreib\w*)\b",
        True,
    ),
    (
        """typo typos grammar spelling spellings punctuation capitalization capitalisation
        docstring docstrings grammatica punteggiatura ortografia ortografía orthographe
        rechtschreibung""",
        r"\w+",
        True,
    ),
    (
        "add aggiungi añade agrega ajoute",
        r"\w+\b[^.\n]{0,30}\b(?:type hints?|types|tipi|tipos|annotations?|annotazioni"
        r"|docstrings?|comments?|commenti|comentarios|commentaires|\w*doc|documentation"
        r"|logging|error handling|gestione degli errori|headings?|emojis?)\b",
        True,
    ),
    (
        "remove strip delete drop rimuovi togli elimina quita supprime entferne",
        r"\w+\b[^.\n]{0,40}\b(?:from|da|dal|dalla|de|du|aus)\s+"
        + _DEICTIC
        + r"|\w+\b[^.\n]{0,30}\b(?:comments?|blank lines|empty lines|duplicates|whitespace"
        r"|emojis?|line numbers|timestamps|print statements|commenti|duplicati)\b",
        True,
    ),
    ("replace replacing replaces", r"\w+\b[^.\n]{1,80}\b(?:with|by)\b", True),
    (
        "same",
        r"same (?:\w+ ){0,2}(?:but|in|with)\b|same (?:content|wording|structure|layout"
        r"|meaning)\b",
        True,
    ),
    (
        "stesso stessa misma mismo même gleiche gleichen",
        r"\w+\b[^.\n]{0,20}\b(?:ma|pero|mais|aber)\b",
        True,
    ),
    (
        "make",
        r"make\s+" + _DEICTIC + r"(?:\s+[\w-]+){0,2}\s+(?:more|less|shorter|longer|simpler"
        r"|clearer|easier|friendlier|punchier|sound|formal|polite|concise)\b",
        True,
    ),
    (
        "apply applica aplica applique",
        r"\w+\s+(?:this|the|these|questa|la|le|este|ce|cette)\s+(?:\w+\s+)?(?:diff|patch"
        r"|changes?|modifiche)\b",
        True,
    ),
    (
        "return give output show send print reply",
        r"(?:reply with|\w+)\b[^.\n]{0,25}\b(?:full|whole|entire|complete|updated|modified"
        r"|corrected|edited|rewritten)\s+(?:\w+\s+)?(?:file|code|function|class|program|text"
        r"|script|module|version|workflow|document|query)\b",
        True,
    ),
    ("give send hand say read write type", r"\w+\b[^.\n]{0,30}\bback\b", True),
    ("return", r"return (?:it|them)\b", True),
    ("give show return send", r"\w+ (?:me )?(?:back )?the (?:result|new version)\b", True),
    ("throughout durchgehend verbatim unchanged unverändert", r"\w+", True),
    ("metti", r"metti\b[^.\n]{0,40}\bin (?:una |un )?(?:tabella|lista|elenco|ordine)\b", True),
    ("formuliere schreibe", r"\w+\b[^.\n]{0,80}\bum\b", True),
    ("füge", r"füge\b[^.\n]{0,60}(?:kommentar|dokumentation|typ)\w*[^.\n]{0,20}\bhinzu\b", True),
    (
        """fix correct improve edit tidy clean modify update shorten simplify change tweak
        revise migliora modifica cambia mejora améliore modifie ändere verbessere
        überarbeite""",
        r"\w+(?: up)?\b[^.\n?]{0,40}?\b" + _DEICTIC,
        False,
    ),
)
# Fixed phrases that mean "the same text back, changed": found with a substring test, which
# is far cheaper than trying a regex at every "as" or "on".
_ECHO_PHRASES: Final = (
    "re-write",
    "re-format",
    "re-indent",
    "re-order",
    "proof-read",
    "copy-edit",
    "vuelve a escribir",
    "swap the order",
    "type hint",
    "type annotation",
    "instead of",
    "on its own line",
    "on their own line",
    "one per line",
    "word for word",
    "as it is",
    "keep the rest",
    "keep everything else",
    "keep the behaviour",
    "keep the behavior",
    "keep behaviour",
    "keep behavior",
    "without changing",
    "without adding",
    "don't change",
    "dont change",
    "do not change",
    "don't add anything",
    "do not add anything",
    "senza modifiche",
    "senza cambiare",
    "senza modificare",
    "tale e quale",
    "sin cambios",
    "sin modificar",
    "sans modification",
    "sans changer",
    "ohne änderungen",
    "ohne zu ändern",
)
# Stems (Italian/Spanish/German inflections, clitics): found with a substring test.
_ECHO_STEMS_TEXT: Final = (
    "translat riscriv riformul corregg tradu tradú riformatt restituisci ripet semplific reescr"
    " reformul corrij réécri übersetz korrigier formatier"
)
_ECHO_PHRASE_INDEX: Final = _Index(_ECHO_PHRASES)
_ECHO_STEMS: Final = tuple(_ECHO_STEMS_TEXT.split())

_ECHO_EXPLICIT: Final = (
    r"\b(?:repeat|ripeti|repite|répète|wiederhole|say|write|scrivi|escribe|écris|schreibe"
    r"|type)\b[^\n]{0,120}?(?<![\w.])(?:\d+|two|three|four|five|six|seven|eight|nine|ten|twenty"
    r"|fifty|hundred|due|tre|quattro|cinque|sei|sette|otto|nove|dieci|venti|cinquanta|cento|dos"
    r"|tres|cuatro|cinco|seis|diez|veinte|cien|deux|trois|quatre|cinq|dix|vingt|cent|zwei|drei"
    r"|vier|fünf|zehn|zwanzig|hundert)\s*(?:times|volte|veces|fois|mal)\b"
    r"|\brepeat after me\s*[:,\-–\"“«']"
    r"|\brepeat (?:this|the following|back)\b|\bripeti (?:questa|questo|il seguente|la seguente)"
    r"|\bcopy (?:out |back )?(?:the following|this|these|it)\b"
    r"|\becho (?:it |this |that |the following |the \w+ )?back\b"
)
_EXPLICIT_GATE: Final = _words("times volte veces fois mal repeat ripeti copy echo")

# A sentence that opens with a question word, or ends in "?" without being a polite request
# ("can you...", "puoi..."), asks about the payload rather than for it back.
_QUESTION_OPENER: Final = (
    r"\s*(?:what|why|how|which|where|when|who|is|are|does|do|did|can (?:this|it|i|we)"
    r"|could (?:this|it|i|we)|should|cosa|che cosa|perch[eé]|come|quale|quali|dove|qué"
    r"|por qué|cómo|cuál|pourquoi|comment|quel|quelle|est-ce|warum|wie|was|welche)\b"
)
_REQUEST_OPENER: Final = (
    r"\s*(?:(?:please|pls|ok|okay|so|and|now|hey|hi)[,!]?\s+)*(?:(?:can|could|would|will) you"
    r"|puoi|potresti|può|potete|mi puoi|mi potresti|puedes|podrías|me puedes|peux-tu"
    r"|pourrais-tu|pouvez-vous|pourriez-vous|kannst du|könntest du|können sie|könnten sie)\b"
)
_SENTENCE: Final = r"[^.!?\n]+[.!?]?"
_SENTENCE_END: Final = r"[.!?\n]"
# Asking about a payload, or for something new made from it, rather than for it back.
_ANALYSIS_WORDS: Final = _words(
    """feedback opinion opinions opinione thoughts think agree continue test tests idea ideas
    meaning significato compare confronta reply respond answer rispondi responde réponds
    antworte headline tagline slogan caption hashtag hashtags keywords"""
)
_ANALYSIS_STEMS: Final = tuple(
    """explain spieg explic expliq erklär summar riassum resum résum zusammen review critique
    critic analy anali assess evaluat valuta suggest recommend consigli continua extract estra
    title titol""".split()
)
_DEBUG_WORDS: Final = _words(
    "error errors exception traceback bug bugs broken wrong why warning panic"
)
_DEBUG_SUBSTRINGS: Final = ("crash", "fail", "doesn't work", "doesnt work", "not working")
_CREATE_VERBS: Final = _words(
    """write draft compose create generate produce propose implement build scrivi crea genera
    proponi implementa escribe redacta écris rédige génère crée schreibe erstelle verfasse
    implementiere"""
)
_CREATE_NEW: Final = (
    r"\w+\s+(?:me\s+|mi\s+)?(?:a|an|some|few|\d+|one|two|three|four|five|ten|un|una|uno|dei"
    r"|delle|degli|unos|unas|une|des|ein|eine|einen)\b"
)
_PRESENTATIONAL: Final = (
    r"\s*(?:here'?s|here is|here are|this is|these are|ecco|voici|hier ist|aquí está)\b"
    r"[^.!?\n,;]*[:.]?\s*$"
)

# Asking for new code: a creation verb, then a code noun in the same sentence.
_CODE_NOUNS: Final = (
    r"\b(?:functions?|class|script|program|query|regex|endpoints?|api|hook|decorator|module"
    r"|workflow|dockerfile|makefile|cli|tests?|component|server|one-liner|snippet|code"
    r"|funzione|classe|programma|query|función|clase|fonction|funktion|klasse|skript"
    r"|programm)\b"
)
_CODE_NOUN_WORDS: Final = _words(
    """function functions class script program query regex endpoint endpoints api hook
    decorator module workflow dockerfile makefile cli test tests component server liner snippet
    code funzione classe programma función clase fonction funktion klasse skript programm"""
)
_WRITE_VERBS: Final = _CREATE_VERBS | _words("give show make explain")
_CODE_WRITE: Final = r"(?:(?:give|show|make) me|(?!give|show|make)\w+)\b[^.\n]{0,60}" + _CODE_NOUNS
_PROSE_NOUNS: Final = _words(
    """story stories poem sonnet haiku limerick letter email mail essay toast speech post
    announcement note message review biography backstory lyrics song racconto poesia lettera
    discorso biografia cuento poema carta histoire poème lettre geschichte gedicht brief rede"""
)
_PROSE_VERBS: Final = _words(
    "write compose draft create tell give scrivi racconta componi escribe écris schreibe"
)
_PROSE_WRITE: Final = (
    r"(?:give me|(?!give)\w+)\b[^.\n]{0,40}\b(?:story|stories|poem|sonnet|haiku|limerick"
    r"|letter|email|e-mail|essay|toast|speech|post|announcement|note|message|review|biography"
    r"|backstory|lyrics|song|racconto|poesia|lettera|mail|discorso|biografia|cuento|poema|carta"
    r"|histoire|poème|lettre|geschichte|gedicht|brief|rede)\b"
)
_NARRATIVE_PHRASES: Final = (
    "who created",
    "who invented",
    "who founded",
    "who wrote",
    "who was",
    "who were",
    "tell me about",
    "tell me the story",
    "was born",
    "were born",
    "chi ha",
    "chi era",
    "quién",
    "evolve",
    "evolved",
    "evolving",
    "evolution",
)
_NARRATIVE_INDEX: Final = _Index(_NARRATIVE_PHRASES)
_DECADE: Final = r"[0-9]{4}s\b"
# Language names that are ordinary words elsewhere count after "in", "using"...
_AMBIGUOUS_LANGS: Final = _words("go c r java rust swift ruby shell dart julia elixir zig ocaml")
_LANG_PHRASES: Final = {
    lang: tuple(f"{prep} {lang}" for prep in ("in", "using", "with", "con", "en", "mit", "per"))
    for lang in _AMBIGUOUS_LANGS
}
_CS_PHRASES: Final = (
    "time complexity",
    "space complexity",
    "big-o",
    "big o",
    "linked list",
    "binary search",
    "binary tree",
    "hash map",
    "hash table",
    "data structure",
)
_CS_INDEX: Final = _Index(_CS_PHRASES)
# An explicit change of subject cancels the coding context of the session.
_TOPIC_RESET_PHRASES: Final = (
    "unrelated",
    "btw",
    "off-topic",
    "off topic",
    "different topic",
    "different question",
    "change of topic",
    "by the way",
    "cambiando discorso",
    "a parte questo",
    "otra pregunta",
    "autre question",
)
_TOPIC_RESET_INDEX: Final = _Index(_TOPIC_RESET_PHRASES)

# Source-code syntax: statements that open a line, operators, calls, command-line flags.
_LINE_KEYWORDS: Final = (
    *(
        f"{word} "
        for word in """def class import from function const let var public private protected
        fn func package using select insert return struct impl use export async""".split()
    ),
    "#include",
    "create table",
    "@",
)
_OPERATORS: Final = r"=>|->|::|!=|==|&&|\|\||\+=|:="
_CALL: Final = r"\([\w\s,.'\"=]{0,40}\)"
_CLI_FLAG: Final = r" --?[a-z][\w-]*(?=[ \t=]|$)"
# A file name is an extension right after a word character: "src/app.py", "routes.ts".
_FILE_EXTENSION: Final = (
    r"\.(?:py|js|ts|tsx|jsx|rs|go|java|kt|c|cc|cpp|h|hpp|cs|rb|php|swift|sql|sh|yml|yaml|toml"
    r"|ini|cfg|gradle|vue|svelte|ipynb)\b"
)
_ERROR_MARKERS: Final = (
    "Traceback (most recent call last)",
    "npm ERR!",
    "panic:",
    "Segmentation fault",
    "error:",
    "error[",
)
_FIM: Final = (
    r"<\|?fim[_▁-]?(?:prefix|suffix|middle|begin|hole|end|pad)\|?>|<｜fim▁(?:begin|hole|end)｜>"
    r"|<(?:PRE|SUF|MID)>"
)
_CODING_SYSTEM: Final = (
    r"\b(?:software (?:engineer|developer|development)|programmer|programming assistant"
    r"|coding assistant|code assistant|programming|coding|codebase|code base|write code"
    r"|source code|search/replace|developer|engineer|assistente di programmazione"
    r"|programmazione|programación|programmation|programmier\w*)\b"
)

_Rules = dict[str, list[tuple[re.Pattern[str], bool]]]  # trigger word -> (regex, strong)


def _compile_rules(rules: Iterable[tuple[str, str, bool]]) -> _Rules:
    """Index rule regexes by trigger word."""
    index: _Rules = {}
    for triggers, regex, strong in rules:
        pattern = re.compile(regex)
        for word in triggers.split():
            index.setdefault(word, []).append((pattern, strong))
    return index


class TaskClassifier:
    """Classify a ``/v1/chat/completions`` or ``/v1/completions`` body as code, prose or echo.

    Rules, in order of precedence:

    1. FIM markers (``<|fim_prefix|>``, ``<fim_prefix>``, ``<PRE>``, DeepSeek's
       ``<｜fim▁begin｜>``), llama-server ``/infill`` fields, or a non-empty ``tools`` /
       ``functions`` list mean **code**: the output is code or a structured call.
    2. **echo** when the last user message asks for an edit that keeps the content (rewrite,
       translate, proofread, refactor, add docstrings/type hints, reformat, apply a diff,
       "return the full file"...) *and* there is a payload of at least ``_MIN_PAYLOAD``
       characters besides the instruction, in that message or, for a short follow-up such as
       "translate it", in one of the last few turns.  Failing a recognised edit verb, a short
       order aimed at a pasted payload ("Spanish version of this:") is echo unless it asks
       about the payload (a question, explain, summarise, review, tests, a title...).
       An explicit repetition ("repeat this five times", "echo back", "repeat after me:") is
       echo without a payload.  Generic verbs (fix, improve, update) need no sign of debugging.
    3. **code** when weighted evidence in the last user message reaches ``_CODE_THRESHOLD``:
       language and tool names, code syntax, fenced blocks, file paths, error logs and "write a
       function"-style asks, minus narrative evidence ("write a story", snake, history).
       Context breaks ties: a coding-assistant system prompt (Continue, Aider, Cline,
       Copilot...) or code in the recent turns adds the threshold by itself, so a neutral
       follow-up inside a coding session ("hi, how are you", "ok, go on") is code, while an
       explicit prose ask there ("write a haiku") or a change of subject still wins.
    4. Otherwise, and for any body it cannot make sense of, **prose**.

    Only bounded slices of the request are scanned, and each rule regex runs only where its
    trigger word occurs, so the cost stays in the tens of microseconds.
    """

    def __init__(self, *, system_cache_size: int = _SYSTEM_CACHE_SIZE) -> None:
        self._echo_rules = _compile_rules(_ECHO_RULES)
        self._echo_rule_words = frozenset(self._echo_rules)
        self._echo_explicit = re.compile(_ECHO_EXPLICIT)
        self._question_opener = re.compile(_QUESTION_OPENER)
        self._request_opener = re.compile(_REQUEST_OPENER)
        self._sentence = re.compile(_SENTENCE)
        self._sentence_end = re.compile(_SENTENCE_END)
        self._create_new = re.compile(_CREATE_NEW)
        self._presentational = re.compile(_PRESENTATIONAL)
        self._code_write = re.compile(_CODE_WRITE)
        self._prose_write = re.compile(_PROSE_WRITE)
        self._decade = re.compile(_DECADE)
        self._operators = re.compile(_OPERATORS)
        self._call = re.compile(_CALL)
        self._cli_flag = re.compile(_CLI_FLAG, re.MULTILINE)
        self._file_extension = re.compile(_FILE_EXTENSION)
        self._fim = re.compile(_FIM)
        self._coding_system = re.compile(_CODING_SYSTEM, re.IGNORECASE)
        self._code_word_keys = frozenset(_CODE_WORDS)
        # Clients resend the same system prompt on every turn; remembering its verdict keeps
        # long agent prompts off the hot path.
        self._system_cache: dict[str, bool] = {}
        self._system_cache_size = system_cache_size

    def classify(self, body: Mapping[str, Any]) -> TaskClass:
        """Return the task class of ``body``; never raises, falls back to ``"prose"``."""
        try:
            return self._classify(body)
        except Exception:
            return "prose"

    def _classify(self, body: Mapping[str, Any]) -> TaskClass:
        if not _is_mapping(body):
            return "prose"
        tools = body.get("tools") or body.get("functions")
        if tools and _is_list(tools):
            return "code"
        if isinstance(body.get("input_prefix"), str) or isinstance(body.get("input_suffix"), str):
            return "code"

        system = ""
        history: list[str] = []
        messages = body.get("messages")
        if messages and _is_list(messages):
            user, user_len, system, history = _split_messages(messages)
        else:
            user, user_len = _bounded(_prompt_text(body.get("prompt")), _USER_HEAD, _USER_TAIL)
        if ("fim" in user or "<PRE>" in user) and self._fim.search(user):
            return "code"

        lower = user.lower()
        stripped = _strip_fences(lower) if "```" in lower else lower
        head_tokens = _tokens(stripped[:_INSTR_HEAD])
        if self._is_echo(user, user_len, stripped, head_tokens, history):
            return "echo"
        # A short message without fences is tokenised once for both stages.
        whole = stripped is lower and len(lower) <= _INSTR_HEAD
        scan = _bounded(user, _SCORE_HEAD, _SCORE_TAIL)[0]
        score = self._code_score(
            scan, _CODE_THRESHOLD, lower if whole else None, head_tokens if whole else None
        )
        if score >= _CODE_THRESHOLD:
            return "code"
        head = lower[:_INSTR_HEAD]
        if _find_phrase(head, head_tokens if whole else _tokens(head), _TOPIC_RESET_INDEX) >= 0:
            return "prose"
        if system and self._system_is_coding(system):
            score += _CODE_THRESHOLD
        if score < _CODE_THRESHOLD and history:
            recent = "\n".join(text[:_HISTORY_HEAD] for text in history[-2:])
            if self._code_score(recent, 2 * _CODE_THRESHOLD) >= 2 * _CODE_THRESHOLD:
                score += _CODE_THRESHOLD
        return "code" if score >= _CODE_THRESHOLD else "prose"

    # ------------------------------------------------------------------------------- echo

    def _is_echo(
        self,
        user: str,
        user_len: int,
        stripped: str,
        head_tokens: frozenset[str],
        history: list[str],
    ) -> bool:
        size = len(stripped)
        zones = [(0, min(size, _INSTR_HEAD))]
        if size > _INSTR_HEAD:
            zones.append((max(_INSTR_HEAD, size - _INSTR_TAIL), size))
        zone_tokens = [head_tokens] + [_tokens(stripped[a:b]) for a, b in zones[1:]]

        for (a, b), tokens in zip(zones, zone_tokens, strict=True):
            if tokens & _EXPLICIT_GATE:
                explicit = self._echo_explicit.search(stripped, a, b)
                if explicit is not None:
                    # "Write a function that prints it 5 times" wants the function.
                    write = self._find_code_write(stripped, tokens, a, b, create_only=True)
                    return write is None or write.end() > explicit.end()

        for (a, b), tokens in zip(zones, zone_tokens, strict=True):
            span, strong = self._first_echo_span(stripped, tokens, a, b)
            if span is None or self._is_question(self._sentence_at(stripped, *span)):
                continue
            if not strong and any(
                _has_debug(stripped[x:y], t) for (x, y), t in zip(zones, zone_tokens, strict=True)
            ):
                continue
            # "Write a script that converts this CSV" asks for new code, not the CSV back.
            write = self._find_code_write(stripped, tokens, a, b, create_only=True)
            if write is not None and write.start() <= span[0]:
                continue
            line_start = stripped.rfind("\n", 0, span[0]) + 1
            line_end = stripped.find("\n", span[1])
            if line_end < 0:
                line_end = size
            colon = stripped.find(":", span[1], line_end)
            instruction = (colon if colon >= 0 else line_end) - line_start
            if user_len - instruction >= _MIN_PAYLOAD or user.count("\n") >= _MIN_PAYLOAD_LINES:
                return True
            # A short follow-up ("now translate it") edits something from an earlier turn.
            if user_len < _INSTR_HEAD and any(len(t) >= _MIN_CONTEXT_PAYLOAD for t in history):
                return True

        return self._is_order_on_payload(user, user_len, stripped)

    def _first_echo_span(
        self, text: str, tokens: frozenset[str], start: int, end: int
    ) -> tuple[tuple[int, int] | None, bool]:
        """Leftmost strong echo cue in text[start:end], else the leftmost weak one."""
        best: dict[bool, tuple[int, int]] = {}
        for word in tokens & self._echo_rule_words:
            rules = self._echo_rules[word]
            for pos in _occurrences(text, word, start, end):
                for pattern, strong in rules:
                    found = best.get(strong)
                    if found is not None and found[0] <= pos:
                        continue
                    match = pattern.match(text, pos, end)
                    if match is not None:
                        best[strong] = match.span()
        # Phrases and stems may take a suffix ("type hints", "traducilo").
        for cues in (*_ECHO_PHRASE_INDEX.candidates(tokens), _ECHO_STEMS):
            for cue in cues:
                if text.find(cue, start, end) < 0:
                    continue
                # Occurrences come in order, so only the first can be the leftmost.
                for pos in _occurrences(text, cue, start, end, whole_word=False):
                    found = best.get(True)
                    if found is None or pos < found[0]:
                        best[True] = (pos, pos + len(cue))
                    break
        if True in best:
            return best[True], True
        return best.get(False), False

    def _is_order_on_payload(self, raw: str, user_len: int, stripped: str) -> bool:
        """Structural fallback: a short order aimed at a pasted payload, asking nothing about it.

        Edit requests are phrased in endless ways ("Spanish version of this", "tighten this
        up"), while asking about a payload has recognisable forms (questions, explain,
        summarise, review, write tests...), so the latter are what gets vetoed.
        """
        if user_len < _MIN_PAYLOAD:
            return False
        lower = raw.lower()
        candidates: list[str] = []
        if "```" in lower:
            text = stripped.strip()
            if len(text) <= _MAX_INSTRUCTION:
                candidates.append(text)
        else:
            head = lower.find("\n\n")
            if 0 < head <= _MAX_INSTRUCTION:
                candidates.append(lower[:head])
            tail = lower.rfind("\n\n")
            if tail > head and len(lower) - tail <= _MAX_INSTRUCTION:
                candidates.append(lower[tail:])
            if not candidates:
                line_end = lower.find("\n")
                first_line = lower if line_end < 0 else lower[:line_end]
                colon = first_line.find(":")
                if 0 < colon <= _MAX_INSTRUCTION:
                    candidates.append(first_line[:colon])
        if not candidates or _has_error_log(raw):
            return False
        ordered = False
        for text in candidates:
            tokens = _tokens(text)
            if (
                tokens & _ANALYSIS_WORDS
                or any(stem in text for stem in _ANALYSIS_STEMS)
                or _has_debug(text, tokens)
                or self._creates_something(text, tokens)
                or any(self._is_question(m.group()) for m in self._sentence.finditer(text))
            ):
                return False
            if (
                user_len - len(text) >= _MIN_PAYLOAD
                and tokens & _DEICTIC_WORDS
                and not self._presentational.match(text)
            ):
                ordered = True
        return ordered

    def _creates_something(self, text: str, tokens: frozenset[str]) -> bool:
        for word in tokens & _CREATE_VERBS:
            for pos in _occurrences(text, word, 0, len(text)):
                if self._create_new.match(text, pos):
                    return True
        return self._find_code_write(text, tokens, 0, len(text), create_only=True) is not None

    def _sentence_at(self, text: str, start: int, end: int) -> str:
        """The sentence around text[start:end]."""
        left = max(text.rfind(c, 0, start) for c in ".!?\n") + 1
        right = self._sentence_end.search(text, end)
        return text[left : right.end() if right else len(text)]

    def _is_question(self, sentence: str) -> bool:
        """Whether ``sentence`` asks something rather than orders something."""
        if self._question_opener.match(sentence):
            return True
        return sentence.rstrip().endswith("?") and not self._request_opener.match(sentence)

    # ------------------------------------------------------------------------------- code

    def _code_score(
        self,
        raw: str,
        need: int,
        lower: str | None = None,
        tokens: frozenset[str] | None = None,
    ) -> int:
        """Weighted code evidence, counted until it reaches ``need``.

        Negative (narrative) evidence is counted first, so stopping early cannot change the
        comparison with ``need``.
        """
        if lower is None:
            lower = raw.lower()
        if tokens is None:
            tokens = _tokens(lower)
        score = sum(_CODE_WORDS[w] for w in tokens & self._code_word_keys)
        score -= 2 * len(tokens & _PROSE_WORDS)
        if tokens & _PROSE_NOUNS and self._find_prose_write(lower, tokens):
            score -= 6
        if _find_phrase(lower, tokens, _NARRATIVE_INDEX) >= 0 or (
            "0s" in lower and self._decade.search(lower)
        ):
            score -= 2
        if score >= need:
            return score
        if "```" in lower:
            score += 3
        if self._has_file_path(lower):
            score += 2
        if score >= need:
            return score
        # Counts and small separate regexes: each regex keeps the engine's literal-prefix scan,
        # which one combined alternation would lose.
        syntax = (
            sum(1 for line in lower.split("\n") if line.lstrip().startswith(_LINE_KEYWORDS))
            + lower.count(";\n")
            + lower.count("{\n")
            + lower.count("}\n")
            + len(self._operators.findall(lower))
            + len(self._cli_flag.findall(lower))
        )
        if syntax < 4 and lower.count("`") >= 2:
            syntax += 1
        if syntax < 4:
            for call in self._call.finditer(lower):
                if call.start() > 0 and lower[call.start() - 1].isalnum():
                    syntax += 1
        score += min(syntax, 4)
        if score >= need:
            return score
        if self._find_code_write(lower, tokens, 0, len(lower)) is not None or self._mentions_cs(
            lower, tokens
        ):
            score += 3
        if score < need and _has_error_log(raw):
            score += 3
        return score

    def _find_code_write(
        self, text: str, tokens: frozenset[str], start: int, end: int, *, create_only: bool = False
    ) -> re.Match[str] | None:
        """First "write/create ... function/script/..." in text[start:end]."""
        if not tokens & _CODE_NOUN_WORDS:
            return None
        verbs = tokens & (_CREATE_VERBS if create_only else _WRITE_VERBS)
        first: re.Match[str] | None = None
        for word in verbs:
            for pos in _occurrences(text, word, start, end):
                if first is not None and first.start() <= pos:
                    break
                match = self._code_write.match(text, pos, end)
                if match is not None:
                    first = match
                    break
        return first

    def _find_prose_write(self, text: str, tokens: frozenset[str]) -> bool:
        for word in tokens & _PROSE_VERBS:
            for pos in _occurrences(text, word, 0, len(text)):
                if self._prose_write.match(text, pos):
                    return True
        return False

    def _mentions_cs(self, text: str, tokens: frozenset[str]) -> bool:
        for lang in tokens & _AMBIGUOUS_LANGS:
            for phrase in _LANG_PHRASES[lang]:
                if phrase in text and any(True for _ in _occurrences(text, phrase, 0, len(text))):
                    return True
        return _find_phrase(text, tokens, _CS_INDEX) >= 0

    def _has_file_path(self, text: str) -> bool:
        for match in self._file_extension.finditer(text):
            before = text[match.start() - 1] if match.start() > 0 else " "
            if before.isalnum() or before == "_":
                return True
        return False

    def _system_is_coding(self, system: str) -> bool:
        cached = self._system_cache.get(system)
        if cached is not None:
            return cached
        verdict = bool(self._coding_system.search(system)) or self._code_score(system, 4) >= 4
        if self._system_cache_size > 0:
            if len(self._system_cache) >= self._system_cache_size:
                self._system_cache.clear()
            self._system_cache[system] = verdict
        return verdict


def _strip_fences(text: str) -> str:
    """``text`` with each fenced block (an unclosed one runs to the end) replaced by a newline."""
    parts: list[str] = []
    pos = 0
    while True:
        start = text.find("```", pos)
        if start < 0:
            parts.append(text[pos:])
            break
        parts.append(text[pos:start])
        parts.append("\n")
        end = text.find("```", start + 3)
        if end < 0:
            break
        pos = end + 3
    return "".join(parts)


def _tokens(text: str) -> frozenset[str]:
    """Distinct words of ``text`` (already lower-cased)."""
    if not text.isascii():
        for char in _UNICODE_PUNCT:
            if char in text:
                text = text.replace(char, " ")
    return frozenset(text.encode().translate(_TOKEN_TABLE).decode().split())


def _is_mapping(value: object) -> TypeGuard[Mapping[str, Any]]:
    # JSON bodies are dicts; the ABC check is several times slower and only a fallback.
    return isinstance(value, (dict, Mapping))


def _is_list(value: object) -> TypeGuard[Sequence[Any]]:
    return isinstance(value, list) or (
        isinstance(value, Sequence) and not isinstance(value, (str, bytes, bytearray))
    )


def _occurrences(
    text: str, word: str, start: int, end: int, *, whole_word: bool = True
) -> Iterator[int]:
    """Start offsets of ``word`` in text[start:end] that begin a word (not "s.replace")."""
    found = 0
    pos = text.find(word, start, end)
    while pos >= 0 and found < _MAX_OCCURRENCES:
        before = text[pos - 1] if pos > 0 else " "
        after_index = pos + len(word)
        after = text[after_index] if after_index < len(text) else " "
        if not (before.isalnum() or before in "._") and (
            not whole_word or not (after.isalnum() or after == "_")
        ):
            found += 1
            yield pos
        pos = text.find(word, pos + 1, end)


def _find_phrase(text: str, tokens: frozenset[str], index: _Index) -> int:
    """Offset of the first indexed phrase found in ``text`` (a suffix may follow), or -1."""
    for cues in index.candidates(tokens):
        for cue in cues:
            if cue in text:
                for pos in _occurrences(text, cue, 0, len(text), whole_word=False):
                    return pos
    return -1


def _has_debug(text: str, tokens: frozenset[str]) -> bool:
    return bool(tokens & _DEBUG_WORDS or any(cue in text for cue in _DEBUG_SUBSTRINGS))


def _has_error_log(raw: str) -> bool:
    """A stack trace or compiler/runtime error in original case ("TypeError", "npm ERR!")."""
    if any(marker in raw for marker in _ERROR_MARKERS):
        return True
    for suffix in ("Error", "Exception"):
        pos = raw.find(suffix, 1)
        while pos > 0:
            end = pos + len(suffix)
            if raw[pos - 1].isalpha() and (end == len(raw) or not raw[end].isalnum()):
                return True
            pos = raw.find(suffix, end)
    return False


def _split_messages(messages: Sequence[Any]) -> tuple[str, int, str, list[str]]:
    """The last user message (bounded, and its full length), system prompt head, recent turns."""
    last_user = -1
    for i in range(len(messages) - 1, -1, -1):
        msg = messages[i]
        if _is_mapping(msg) and msg.get("role") == "user":
            last_user = i
            break
    if last_user < 0:
        # No user turn (e.g. a prefilled assistant continuation): judge the last message.
        last_user = len(messages) - 1
    last = messages[last_user]
    content = last.get("content") if _is_mapping(last) else None
    user, user_len = _bounded(_content_text(content), _USER_HEAD, _USER_TAIL)

    system_parts: list[str] = []
    for msg in messages[:3]:
        if _is_mapping(msg) and msg.get("role") in ("system", "developer"):
            system_parts.append(_content_text(msg.get("content"))[:_SYSTEM_HEAD])
    history: list[str] = []
    for msg in messages[max(0, last_user - _HISTORY_MESSAGES) : last_user]:
        if _is_mapping(msg) and msg.get("role") in ("user", "assistant"):
            history.append(_content_text(msg.get("content")))
    return user, user_len, "\n".join(system_parts)[:_SYSTEM_HEAD], history


def _content_text(content: object) -> str:
    """Text of a message ``content``: a string or a list of ``{"type": "text"}`` parts."""
    if isinstance(content, str):
        return content
    if _is_list(content):
        texts = [
            part["text"]
            for part in content
            if _is_mapping(part) and isinstance(part.get("text"), str)
        ]
        return "\n".join(texts)
    return ""


def _prompt_text(prompt: object) -> str:
    """Text of a ``/v1/completions`` ``prompt``: a string or a list of strings."""
    if isinstance(prompt, str):
        return prompt
    if _is_list(prompt):
        return "\n".join(p for p in prompt if isinstance(p, str))
    return ""


def _bounded(text: str, head: int, tail: int) -> tuple[str, int]:
    """Head and tail of ``text`` within a scan budget, plus the full length."""
    if len(text) <= head + tail:
        return text, len(text)
    return text[:head] + "\n" + text[-tail:], len(text)
