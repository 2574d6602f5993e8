"""Cheap rule-based classification of an OpenAI request body into a task class."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal

TaskClass = Literal["code", "prose", "echo"]
TASK_CLASSES: Final[tuple[TaskClass, ...]] = ("code", "prose", "echo")

# Scan bounds: enough to see the instruction and a representative slice of any payload, while
# keeping a 200 KB request as cheap as a 2 KB one.
_USER_HEAD: Final = 8_000
_USER_TAIL: Final = 4_000
_SYSTEM_HEAD: Final = 2_000
_HISTORY_MESSAGES: Final = 4
_HISTORY_HEAD: Final = 1_500
# Instructions sit at the start or the end of a message, around the pasted payload.
_INSTR_HEAD: Final = 600
_INSTR_TAIL: Final = 400
# Below this many characters there is nothing worth "repeating"; short quoted phrases
# ("how do you say 'thank you'") are ordinary questions.
_MIN_PAYLOAD: Final = 150
_MIN_PAYLOAD_LINES: Final = 6
_MIN_CONTEXT_PAYLOAD: Final = 200
# An instruction longer than this is a conversation, not a short order about a payload.
_MAX_INSTRUCTION: Final = 400
_CODE_THRESHOLD: Final = 2
_SYSTEM_CACHE_SIZE: Final = 256

# Distinct words that point to code; 2 = rarely anything but software, 1 = ambiguous alone
# ("class", "code", "java") and only tips the balance together with other evidence.
_CODE_WORDS: Final[dict[str, int]] = {
    **dict.fromkeys(
        # languages, frameworks and libraries
        """python javascript typescript js ts tsx jsx golang kotlin c++ c# php sql postgresql
        postgres mysql sqlite mongodb redis bash zsh powershell haskell scala perl lua dart
        html css react vue angular svelte django flask fastapi pandas numpy matplotlib sklearn
        pytorch tensorflow node nodejs docker dockerfile kubernetes k8s terraform regex regexp
        json yaml toml xml api apis http https graphql grpc jest pytest unittest sqlalchemy
        asyncio tokio serde clap pygame latex vba linq cpython jvm jupyter tailwind jquery
        laravel symfony nestjs nuxt redux babel eslint prettier mypy ruff pylint junit yarn
        pnpm deno"""
        # tools and commands
        """ git github gitlab npm pip conda venv virtualenv cargo maven gradle cmake gcc clang
        makefile cli ide vscode vim emacs tmux ssh chmod chown sudo curl wget grep sed awk cron
        crontab systemd systemctl nginx webpack vite stdin stdout stderr localhost repo codebase
        ci"""
        # keywords, identifiers and algorithm names that are not ordinary words
        """ const enum struct typedef namespace nullptr elif println printf malloc boolean
        varchar uuid base64 utf hashmap hashtable quicksort mergesort dijkstra fizzbuzz bfs dfs
        goroutine goroutines implement implementa implementiere implémente""".split(),
        2,
    ),
    **dict.fromkeys(
        """function functions method methods class classes script scripts code coding program
        programming programmer bug bugs debug debugging compile compiler compiles variable
        variables loop recursion recursive algorithm endpoint endpoints query queries library
        module modules snippet implementation refactor commit deploy server database backend
        frontend integer string strings array arrays dict dictionary null undefined exception
        traceback syntax parse parser runtime thread threads async await callback lambda
        terminal fixture controller crud component hook decorator timeit benchmark unix linux
        java rust swift ruby shell interface excel formula spreadsheet migration migrations
        schema complexity pointer pointers app apps unicode ascii fibonacci palindrome pseudocode
        funzione funzioni classe classi metodo metodi codice programma variabile dizionario
        dizionari stringa eccezione libreria ciclo función funciones código clase método
        biblioteca fonction fonctions méthode programme bibliothèque funktion funktionen klasse
        methode programm skript codebeispiel closure""".split(),
        1,
    ),
}

# Words that say the output is narrative, or that a code-ish word means something else
# (python the snake, Java the island, dress code).
_PROSE_WORDS: Final[frozenset[str]] = frozenset(
    """story stories poem poems poetry sonnet haiku limerick novel essay letter email e-mail
    toast speech biography tale fairy lyrics song recipe snake snakes reptile zoo pet pets
    captivity island temple trip itinerary holiday vacation weekend kids children family
    daughter son mum mom dad figlia figlio hija hijo fille fils tochter sohn
    grandma party restaurant history historical feelings feel book books movie film
    announcement backstory wedding birthday
    racconto racconti poesia favola lettera discorso biografia storia viaggio ricetta vacanza
    bambini famiglia cuento poema carta historia receta viaje histoire poème lettre conte
    voyage geschichte gedicht brief rede kurzgeschichte reise""".split()
)

# The object an edit verb points at: the pasted payload, or the previous turn.
_DEICTIC = (
    r"(?:this|these|that|those|it|them|the following|below|above|my|questo|questa|questi"
    r"|queste|quest'|il seguente|la seguente|lo|la|este|esta|estos|estas|el siguiente|lo|ce"
    r"|cet|cette|ces|suivant|diese[nmrs]?|folgenden?|den text)\b"
)
# Verbs that by themselves mean "give me this text back, transformed".
_ECHO_VERBS = (
    r"(?<![\w.])(?:re-?write|rephrase|reword|paraphrase|proof-?read|copy-?edit|re-?format"
    r"|re-?indent|refactor|rename|translat\w*|transliterate|redact|anonymi[sz]e|censor"
    r"|alphabeti[sz]e|reorder|re-order|swap the order|moderni[sz]e|simplify|restructure|convert"
    r"|reorgani[sz]e|condense|locali[sz]e|normali[sz]e|standardi[sz]e|prettify|beautify|minify"
    r"|riscriv\w*|riformul\w*|correggi\w*|tradu[ckzi]\w*|riformatt\w*|restituisci\w*|ripeti\w*"
    r"|rend(?:ilo|ila|ili|erlo|erla|erli)|semplific\w*|reescr\w*|vuelve a escribir|reformul\w*"
    r"|corrige[sz]?|corrij\w*|tradúce\w*|réécri\w*|übersetze\w*|korrigiere\w*|umschreiben"
    r"|formatiere\w*)\b"
)
# Verbs that transform only when aimed at the payload ("convert this", "put these into").
_ECHO_DEICTIC = (
    r"(?<![\w.])(?:convert|transform|turn|put|port|migrate|upgrade|format|sort|polish|adjust|swap"
    r"|split"
    r"|metti|mettete|trasforma|converti|sistema\w*|convierte|transforma|pon|mets|mettez"
    r"|transforme|convertis|setze|konvertiere|wandle|verwandle)\b[^.\n?]{0,40}?\b" + _DEICTIC
)
_ECHO_STRONG: Final = (
    _ECHO_VERBS
    + r"|" + _ECHO_DEICTIC
    + r"|(?<![\w.])write (?:this|it|these|that|the following)\b"
    + r"|(?<![\w.])(?:fix|correct|clean up|tidy(?: up)?|improve|sistema\w*|check)\b[^.\n]{0,30}"
    r"\b(?:grammar|spelling|typos?|punctuation|mistakes|indentation|formatting|format|wording"
    r"|style|english|italian|capitali[sz]ation|punteggiatura|grammatica|ortografia|ortografía"
    r"|orthographe|rechtschreib\w*)\b"
    r"|(?<![\w.])(?:add|aggiungi|añade|agrega|ajoute)\b[^.\n]{0,30}\b(?:type hints?|types|tipi"
    r"|tipos|annotations?|annotazioni|docstrings?|comments?|commenti|comentarios|commentaires"
    r"|\w*doc|documentation|logging|error handling|gestione degli errori|headings?|emojis?)\b"
    # Form-only edits are echo whatever verb introduces them ("a once-over for typos").
    r"|\b(?:typos?|grammar|spellings?|punctuation|capitali[sz]ation|type (?:hints?|annotations?)"
    r"|docstrings?|grammatica|punteggiatura|ortografia|ortografía|orthographe|rechtschreibung)\b"
    r"|\binstead of\b|\bsame (?:\w+ ){0,2}(?:but|in|with)\b"
    r"|\b(?:stess[oa]|misma?|même|gleiche[n]?)\b[^.\n]{0,20}\b(?:ma|pero|mais|aber)\b"
    r"|(?<![\w.])(?:remove|strip|delete|drop|rimuovi|togli|elimina|quita|supprime|entferne)\b"
    r"[^.\n]{0,40}\b(?:from|da|dal|dalla|de|du|aus)\s+"
    + _DEICTIC
    + r"|(?<![\w.])(?:remove|strip|delete|drop|rimuovi|togli|elimina|supprime|entferne)\b"
    r"[^.\n]{0,30}\b(?:comments?|blank lines|empty lines|duplicates|whitespace|emojis?"
    r"|line numbers|timestamps|print statements|commenti|duplicati)\b"
    r"|(?<![\w.])replac\w*\b[^.\n]{1,80}\b(?:with|by)\b"
    r"|(?<![\w.])make\s+" + _DEICTIC + r"(?:\s+[\w-]+){0,2}\s+(?:more|less|shorter|longer"
    r"|simpler|clearer|easier|friendlier|punchier|sound|formal|polite|concise)\b"
    r"|(?<![\w.])(?:apply|applica|aplica|applique)\s+(?:this|the|these|questa|la|le|este"
    r"|ce|cette)\s+(?:\w+\s+)?(?:diff|patch|changes?|modifiche)\b"
    r"|\b(?:return|give|output|show|send|print|reply with)\b[^.\n]{0,25}\b(?:full|whole|entire"
    r"|complete|updated|modified|corrected|edited|rewritten)\s+(?:\w+\s+)?(?:file|code|function"
    r"|class|program|text|script|module|version|workflow|document|query)\b"
    r"|\b(?:give|send|hand|say|read|write|type)\b[^.\n]{0,30}\bback\b|\breturn (?:it|them)\b"
    r"|\b(?:give|show|return|send) (?:me )?(?:back )?the (?:result|new version)\b"
    r"|\bon (?:its|their) own line\b|\bone per line\b|\bthroughout\b|\bdurchgehend\b"
    r"|\b(?:same (?:content|wording|structure|layout|meaning)|word for word|verbatim"
    r"|unchanged|as it is|keep (?:the rest|everything else|(?:the )?behaviou?r)|without changing"
    r"|(?:don'?t|do not) change|(?:don'?t|do not) add anything|without adding"
    r"|senza (?:modifiche|cambiare|modificare)|tale e quale|sin (?:cambios|modificar)"
    r"|sans (?:modification|changer)|unverändert|ohne (?:änderungen|zu ändern))\b"
    r"|\bmetti\b[^.\n]{0,40}\bin (?:una |un )?(?:tabella|lista|elenco|ordine)\b"
    r"|\b(?:formuliere|schreibe)\b[^.\n]{0,80}\bum\b"
    r"|\bfüge\b[^.\n]{0,60}(?:kommentar|dokumentation|typ)\w*[^.\n]{0,20}\bhinzu\b"
)
# Generic edit verbs: echo only when nothing suggests a bug hunt.
_ECHO_WEAK: Final = (
    r"(?<![\w.])(?:fix|correct|improve|edit|tidy(?: up)?|clean up|modify|update|shorten"
    r"|simplify|change|tweak|revise|migliora|modifica|cambia|mejora|améliore|modifie|ändere"
    r"|verbessere|überarbeite)\b[^.\n?]{0,40}?\b" + _DEICTIC
)
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
_SENTENCE_END: Final = r"[.!?\n]"
_SENTENCE: Final = r"[^.!?\n]+[.!?]?"
# Asking about a payload, or for something new made from it, rather than for it back.
_ANALYSIS: Final = (
    r"\b(?:explain\w*|spieg\w*|expli[cq]\w*|erklär\w*|summar\w*|riassum\w*|resum\w*|résum\w*"
    r"|zusammen\w*|review\w*|critique\w*|critic\w*|analy[sz]\w*|anali[sz]\w*|assess\w*"
    r"|evaluat\w*|valuta\w*|feedback|opinion\w*|thoughts|think|agree|suggest\w*|recommend\w*"
    r"|consigli\w*|continue|continua\w*|tests?|ideas?|meaning|significato|compare|confronta"
    r"|reply|respond|answer|rispondi|responde|réponds|antworte|extract\w*|estra\w*|title\w*"
    r"|titol\w*|headline|tagline|slogan|caption|hashtags?|keywords|tl;dr)\b"
)
_CREATE_NEW: Final = (
    r"\b(?:write|draft|compose|create|generate|produce|propose|scrivi|crea|genera|proponi"
    r"|escribe|redacta|écris|rédige|génère|schreibe|erstelle|verfasse)\s+(?:me\s+|mi\s+)?"
    r"(?:a|an|some|few|\d+|one|two|three|four|five|ten|un|una|uno|dei|delle|degli|unos|unas"
    r"|une|des|ein|eine|einen)\b"
)
_PRESENTATIONAL: Final = (
    r"\s*(?:here'?s|here is|here are|this is|these are|ecco|voici|hier ist|aquí está)\b[^.!?\n,;]*"
    r"[:.]?\s*$"
)
_DEBUG: Final = (
    r"\b(?:error|errors|exception|traceback|bugs?|crash\w*|fail\w*|broken|doesn'?t work"
    r"|not working|wrong|why|warning|panic)\b"
)
_CREATE_VERBS = (
    r"write|create|implement|build|generate|scrivi|crea|implementa|escribe|écris|crée|schreibe"
    r"|erstelle|implementiere"
)
_CODE_NOUNS = (
    r"\b(?:functions?|class|script|program|query|regex|endpoints?|api|hook|decorator|module"
    r"|workflow|dockerfile|makefile|cli|tests?|component|server|one-liner|snippet|code"
    r"|funzione|classe|programma|query|función|clase|fonction|funktion|klasse|skript"
    r"|programm)\b"
)
# Asking for new code; the narrower form (creation verbs only) vetoes an echo reading.
_CODE_WRITE: Final = (
    r"\b(?:" + _CREATE_VERBS + r"|give me|show me|make me|explain)\b[^.\n]{0,60}" + _CODE_NOUNS
)
_CODE_CREATE: Final = r"\b(?:" + _CREATE_VERBS + r")\b[^.\n]{0,60}" + _CODE_NOUNS
# "in Go", "using C" (language names that are ordinary words elsewhere) and CS phrases.
_CODE_PHRASES: Final = (
    r"\b(?:in|using|with|con|en|mit|per) (?:go|c|r|java|rust|swift|ruby|shell|dart|julia"
    r"|elixir|zig|ocaml)\b"
    r"|\b(?:time|space) complexity|\bbig-?o\b|\bo\((?:1|n|log n|n log n|n\^2|n²)\)"
    r"|\blinked lists?|\bbinary (?:search|tree)|\bhash (?:map|table)|\bdata structures?"
)
_PROSE_WRITE: Final = (
    r"\b(?:write|compose|draft|create|tell|give me|scrivi|racconta|componi|escribe|écris"
    r"|schreibe)\b[^.\n]{0,40}\b(?:story|stories|poem|sonnet|haiku|limerick|letter|email|e-mail"
    r"|essay|toast|speech|post|announcement|note|message|review|biography|backstory|lyrics"
    r"|song|racconto|poesia|lettera|mail|discorso|biografia|cuento|poema|carta|histoire|poème"
    r"|lettre|geschichte|gedicht|brief|rede)\b"
)
_NARRATIVE: Final = (
    r"\b(?:who (?:created|invented|founded|wrote|was|were)|tell me (?:about|the story)"
    r"|evolv\w*|in the \d{4}s|were born|was born|chi (?:ha|era)|quién)\b"
)
# An explicit change of subject cancels the coding context of the session.
_TOPIC_RESET: Final = (
    r"\b(?:unrelated|off[- ]topic|different (?:topic|question)|change of topic|by the way|btw"
    r"|cambiando discorso|a parte questo|otra pregunta|autre question)\b"
)
# Source-code syntax; multiline so that line starts count.
_SYNTAX: Final = (
    r"^[ \t]*(?:def|class|import|from\s+\S+\s+import|#include|function|const|let|var|public"
    r"|private|protected|fn|func|package|using|select|insert|create table|return|struct|impl"
    r"|use|export|async|@\w+)\b"
    r"|[;{}][ \t]*$|=>|->|::|!=|==|&&|\|\||\+=|:="
    r"|`[^`\n]{1,60}`"
    r"|(?:^|[ \t])--?[a-z][\w-]*(?=[ \t=]|$)"
    r"|\b\w+\([\w\s,.'\"=]*\)"
)
_FILE_PATH: Final = (
    r"\b[\w./-]+\.(?:py|js|ts|tsx|jsx|rs|go|java|kt|c|cc|cpp|h|hpp|cs|rb|php|swift|sql|sh|yml"
    r"|yaml|toml|ini|cfg|gradle|vue|svelte|ipynb)\b"
)
_ERROR_LOG: Final = (
    r"Traceback \(most recent call last\)|\b\w+(?:Error|Exception)\b|npm ERR!|panic:"
    r"|Segmentation fault|\berror(?:\[E\d+\])?:"
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
_FENCE: Final = r"```.*?(?:```|\Z)"
_WORD: Final = r"\w+(?:\+\+|#)?"


class TaskClassifier:
    """Classify a ``/v1/chat/completions`` or ``/v1/completions`` body as code, prose or echo.

    Rules, in order of precedence:

    1. FIM markers (``<|fim_prefix|>``, ``<fim_prefix>``, ``<PRE>``, DeepSeek's
       ``<｜fim▁begin｜>``), llama-server ``/infill`` fields, or a non-empty ``tools`` /
       ``functions`` list mean **code**: the output is code or a structured call.
    2. **echo** when the last user message asks for an edit that keeps the content (rewrite,
       translate, proofread, refactor, add docstrings/type hints, reformat, apply a diff,
       "return the full file", ...) *and* there is a payload of at least ``_MIN_PAYLOAD``
       characters besides the instruction, either in that message or, for a short follow-up
       such as "translate it", in one of the last few turns.  An explicit repetition
       ("repeat this five times", "echo back", "repeat after me:") is echo without a payload.
       Generic verbs (fix, improve, update) count only when nothing hints at debugging.
    3. **code** when weighted evidence reaches ``_CODE_THRESHOLD``: language and tool names,
       code syntax, fenced blocks, file paths, error logs and "write a function"-style asks in
       the last user message; minus narrative evidence ("write a story", snake, history).
       A coding-assistant system prompt (Continue, Aider, Cline, Copilot...) adds the threshold
       by itself, and code in the recent turns adds it too, so a neutral follow-up inside a coding
       session ("hi, how are you", "ok, go on") is code, while an explicit prose ask there
       ("write a haiku") still outweighs it.
    4. Otherwise, and for any body it cannot make sense of, **prose**.
    """

    def __init__(self) -> None:
        flags = re.IGNORECASE
        self._echo_strong = re.compile(_ECHO_STRONG, flags)
        self._echo_weak = re.compile(_ECHO_WEAK, flags)
        self._echo_explicit = re.compile(_ECHO_EXPLICIT, flags)
        self._question_opener = re.compile(_QUESTION_OPENER, flags)
        self._request_opener = re.compile(_REQUEST_OPENER, flags)
        self._sentence_end = re.compile(_SENTENCE_END)
        self._sentence = re.compile(_SENTENCE)
        self._analysis = re.compile(_ANALYSIS, flags)
        self._create_new = re.compile(_CREATE_NEW, flags)
        self._presentational = re.compile(_PRESENTATIONAL, flags)
        self._deictic = re.compile(r"\b" + _DEICTIC, flags)
        self._debug = re.compile(_DEBUG, flags)
        self._code_write = re.compile(_CODE_WRITE, flags)
        self._code_create = re.compile(_CODE_CREATE, flags)
        self._prose_write = re.compile(_PROSE_WRITE, flags)
        self._narrative = re.compile(_NARRATIVE, flags)
        self._code_phrases = re.compile(_CODE_PHRASES, flags)
        self._topic_reset = re.compile(_TOPIC_RESET, flags)
        self._syntax = re.compile(_SYNTAX, re.MULTILINE)
        self._file_path = re.compile(_FILE_PATH)
        self._error_log = re.compile(_ERROR_LOG)
        self._fim = re.compile(_FIM)
        self._coding_system = re.compile(_CODING_SYSTEM, flags)
        self._fence = re.compile(_FENCE, re.DOTALL)
        self._word = re.compile(_WORD)
        self._code_words = _CODE_WORDS
        self._code_word_keys = frozenset(_CODE_WORDS)
        self._prose_words = _PROSE_WORDS
        # Clients resend the same system prompt on every turn; remembering its verdict keeps
        # long agent prompts off the hot path.
        self._system_cache: dict[str, bool] = {}

    def classify(self, body: Mapping[str, Any]) -> TaskClass:
        """Return the task class of ``body``; never raises, falls back to ``"prose"``."""
        try:
            return self._classify(body)
        except Exception:
            return "prose"

    def _classify(self, body: Mapping[str, Any]) -> TaskClass:
        if not isinstance(body, Mapping):
            return "prose"
        if body.get("tools") or body.get("functions"):
            return "code"
        if isinstance(body.get("input_prefix"), str) or isinstance(body.get("input_suffix"), str):
            return "code"

        system = ""
        history: list[str] = []
        messages = body.get("messages")
        if isinstance(messages, Sequence) and not isinstance(messages, str) and messages:
            user, user_len, system, history = self._split_messages(messages)
        else:
            user, user_len = _bounded(_prompt_text(body.get("prompt")))
        if self._fim.search(user):
            return "code"

        if self._is_echo(user, user_len, history):
            return "echo"
        lower = user.lower()
        score = self._code_score(lower, user)
        if score >= _CODE_THRESHOLD or self._topic_reset.search(lower, 0, _INSTR_HEAD):
            return "code" if score >= _CODE_THRESHOLD else "prose"
        if system and self._system_is_coding(system):
            score += _CODE_THRESHOLD
        if score < _CODE_THRESHOLD and history:
            recent = "\n".join(text[:_HISTORY_HEAD] for text in history[-2:])
            if self._code_score(recent.lower(), recent) >= 2 * _CODE_THRESHOLD:
                score += _CODE_THRESHOLD
        return "code" if score >= _CODE_THRESHOLD else "prose"

    def _split_messages(self, messages: Sequence[Any]) -> tuple[str, int, str, list[str]]:
        """Pick the last user message, the system prompt head and the recent other turns."""
        last_user = -1
        for i in range(len(messages) - 1, -1, -1):
            msg = messages[i]
            if isinstance(msg, Mapping) and msg.get("role") == "user":
                last_user = i
                break
        if last_user < 0:
            # No user turn (e.g. a prefilled assistant continuation): judge the last message.
            last_user = len(messages) - 1
        last = messages[last_user]
        user, user_len = (
            _bounded(_content_text(last.get("content"))) if isinstance(last, Mapping) else ("", 0)
        )

        system_parts: list[str] = []
        for msg in messages[:3]:
            if isinstance(msg, Mapping) and msg.get("role") in ("system", "developer"):
                system_parts.append(_content_text(msg.get("content"))[:_SYSTEM_HEAD])
        history: list[str] = []
        for msg in messages[max(0, last_user - _HISTORY_MESSAGES) : last_user]:
            if isinstance(msg, Mapping) and msg.get("role") in ("user", "assistant"):
                history.append(_content_text(msg.get("content")))
        return user, user_len, "\n".join(system_parts)[:_SYSTEM_HEAD], history

    def _is_echo(self, user: str, user_len: int, history: list[str]) -> bool:
        stripped = self._fence.sub("\n", user)
        zones = [(0, min(len(stripped), _INSTR_HEAD))]
        if len(stripped) > _INSTR_HEAD:
            zones.append((max(_INSTR_HEAD, len(stripped) - _INSTR_TAIL), len(stripped)))

        for a, b in zones:
            explicit = self._echo_explicit.search(stripped, a, b)
            if explicit is not None:
                # "Write a function that prints it 5 times" wants the function.
                write = self._code_create.search(stripped, a, b)
                return write is None or write.end() > explicit.end()

        for a, b in zones:
            match = self._echo_strong.search(stripped, a, b)
            weak = match is None
            if weak:
                match = self._echo_weak.search(stripped, a, b)
            if match is None or self._is_question(self._sentence_at(stripped, match)):
                continue
            if weak and self._debug.search(stripped, 0, _INSTR_HEAD + _INSTR_TAIL):
                continue
            # "Write a script that converts this CSV" asks for new code, not the CSV back.
            write = self._code_create.search(stripped, a, b)
            if write is not None and write.start() <= match.start():
                continue
            line_start = stripped.rfind("\n", 0, match.start()) + 1
            line_end = stripped.find("\n", match.end())
            if line_end < 0:
                line_end = len(stripped)
            colon = stripped.find(":", match.end(), line_end)
            instruction = (colon if colon >= 0 else line_end) - line_start
            if user_len - instruction >= _MIN_PAYLOAD or user.count("\n") >= _MIN_PAYLOAD_LINES:
                return True
            # A short follow-up ("now translate it") edits something from an earlier turn.
            if user_len < _INSTR_HEAD and any(len(t) >= _MIN_CONTEXT_PAYLOAD for t in history):
                return True

        return self._is_order_on_payload(user, user_len, stripped)

    def _is_order_on_payload(self, user: str, user_len: int, stripped: str) -> bool:
        """Structural fallback: a short order aimed at a pasted payload, asking nothing about it.

        Edit requests are phrased in endless ways ("Spanish version of this", "tighten this
        up"), while asking about a payload has recognisable forms (questions, explain,
        summarise, review, write tests...), so the latter are what gets vetoed.
        """
        if user_len < _MIN_PAYLOAD:
            return False
        candidates: list[str] = []
        if "```" in user:
            text = stripped.strip()
            if len(text) <= _MAX_INSTRUCTION:
                candidates.append(text)
        else:
            head = user.find("\n\n")
            if 0 < head <= _MAX_INSTRUCTION:
                candidates.append(user[:head])
            tail = user.rfind("\n\n")
            if tail > head and len(user) - tail <= _MAX_INSTRUCTION:
                candidates.append(user[tail:])
            if not candidates:
                line_end = user.find("\n")
                first_line = user if line_end < 0 else user[:line_end]
                colon = first_line.find(":")
                if 0 < colon <= _MAX_INSTRUCTION:
                    candidates.append(first_line[:colon])
        if not candidates or self._error_log.search(user):
            return False
        ordered = False
        for text in candidates:
            if (
                self._analysis.search(text)
                or self._debug.search(text)
                or self._create_new.search(text)
                or self._code_create.search(text)
                or any(self._is_question(m.group()) for m in self._sentence.finditer(text))
            ):
                return False
            if (
                user_len - len(text) >= _MIN_PAYLOAD
                and self._deictic.search(text)
                and not self._presentational.match(text)
            ):
                ordered = True
        return ordered

    def _sentence_at(self, text: str, match: re.Match[str]) -> str:
        start = max(text.rfind(c, 0, match.start()) for c in ".!?\n") + 1
        end = self._sentence_end.search(text, match.end())
        return text[start : end.end() if end else len(text)]

    def _is_question(self, sentence: str) -> bool:
        if self._question_opener.match(sentence):
            return True
        return sentence.rstrip().endswith("?") and not self._request_opener.match(sentence)

    def _code_score(self, lower: str, raw: str) -> int:
        words = set(self._word.findall(lower))
        score = sum(self._code_words[w] for w in words & self._code_word_keys)
        score -= 2 * len(words & self._prose_words)
        syntax = 0
        for _ in self._syntax.finditer(raw):
            syntax += 1
            if syntax == 4:
                break
        score += syntax
        if "```" in raw:
            score += 3
        if self._file_path.search(raw):
            score += 2
        if self._error_log.search(raw):
            score += 3
        if self._code_write.search(lower) or self._code_phrases.search(lower):
            score += 3
        if self._prose_write.search(lower):
            score -= 6
        if self._narrative.search(lower):
            score -= 2
        return score

    def _system_is_coding(self, system: str) -> bool:
        cached = self._system_cache.get(system)
        if cached is not None:
            return cached
        lower = system.lower()
        verdict = bool(self._coding_system.search(lower)) or self._code_score(lower, system) >= 4
        if len(self._system_cache) >= _SYSTEM_CACHE_SIZE:
            self._system_cache.clear()
        self._system_cache[system] = verdict
        return verdict


def _content_text(content: object) -> str:
    """Text of a message ``content``: a string or a list of ``{"type": "text"}`` parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence) and not isinstance(content, (bytes, bytearray)):
        texts = [
            part["text"]
            for part in content
            if isinstance(part, Mapping) and isinstance(part.get("text"), str)
        ]
        return "\n".join(texts)
    return ""


def _prompt_text(prompt: object) -> str:
    """Text of a ``/v1/completions`` ``prompt``: a string or a list of strings."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, Sequence) and not isinstance(prompt, (bytes, bytearray)):
        return "\n".join(p for p in prompt if isinstance(p, str))
    return ""


def _bounded(text: str) -> tuple[str, int]:
    """Head and tail of ``text`` within the scan budget, plus the full length."""
    if len(text) <= _USER_HEAD + _USER_TAIL:
        return text, len(text)
    return text[:_USER_HEAD] + "\n" + text[-_USER_TAIL:], len(text)
