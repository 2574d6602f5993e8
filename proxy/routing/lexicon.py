"""The classifier's vocabulary: word sets, and the regexes generated from them, compiled once.

Every alternation in a regex here is built from a word set by ``alternation``, so a word added
to a set is also matched by the regexes that use it: the two cannot drift apart.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final

from proxy.routing.phrases import PhraseIndex, alternation, bounded, gate_words, words

# ------------------------------------------------------------------------------- code words

# Distinct words that point to code; 2 = rarely anything but software, 1 = ambiguous alone
# ("class", "code", "java") and only tips the balance together with other evidence.
CODE_WORDS_STRONG: Final = words(
    # languages, frameworks and libraries
    """python javascript typescript js ts tsx jsx golang kotlin c++ c# php sql postgresql
    postgres mysql sqlite mongodb redis bash zsh powershell haskell scala perl lua dart html css
    react vue angular svelte django flask fastapi pandas numpy matplotlib sklearn pytorch
    tensorflow node nodejs docker dockerfile kubernetes k8s terraform regex regexp json yaml
    toml xml api apis http https graphql grpc jest pytest unittest sqlalchemy asyncio tokio serde
    clap pygame latex vba linq cpython jvm jupyter tailwind jquery laravel symfony nestjs nuxt
    redux babel eslint prettier mypy ruff pylint junit yarn pnpm deno"""
    # tools and commands
    """ git github gitlab npm pip conda venv virtualenv cargo maven gradle cmake gcc clang
    makefile cli ide vscode vim emacs tmux ssh chmod chown sudo curl wget grep sed awk cron
    crontab systemd systemctl nginx webpack vite stdin stdout stderr localhost repo codebase ci"""
    # keywords, identifiers and algorithm names that are not ordinary words
    """ const enum struct typedef namespace nullptr elif println printf malloc boolean varchar
    uuid base64 utf hashmap hashtable quicksort mergesort dijkstra fizzbuzz bfs dfs goroutine
    goroutines implement implementa implementiere implémente"""
)
CODE_WORDS_WEAK: Final = words(
    """function functions method methods class classes script scripts code coding program
    programming programmer bug bugs debug debugging compile compiler compiles variable variables
    loop recursion recursive algorithm endpoint endpoints query queries library module modules
    snippet implementation refactor commit deploy server database backend frontend integer
    string strings array arrays dict dictionary null undefined exception traceback syntax parse
    parser runtime thread threads async await callback lambda terminal fixture controller crud
    component hook decorator timeit benchmark unix linux java rust swift ruby shell interface
    excel formula spreadsheet migration migrations schema complexity pointer pointers app apps
    unicode ascii fibonacci palindrome pseudocode funzione funzioni classe classi metodo metodi
    codice programma variabile dizionario dizionari stringa eccezione libreria ciclo función
    funciones código clase método biblioteca fonction fonctions méthode programme bibliothèque
    funktion funktionen klasse methode programm skript codebeispiel closure"""
)
CODE_WORDS: Final[dict[str, int]] = {
    **dict.fromkeys(CODE_WORDS_WEAK, 1),
    **dict.fromkeys(CODE_WORDS_STRONG, 2),
}

# Words that say the output is narrative, or that a code-ish word means something else
# (python the snake, Java the island, dress code).
PROSE_WORDS: Final = words(
    """story stories poem poems poetry sonnet haiku limerick novel essay letter email mail toast
    speech biography tale fairy lyrics song recipe snake snakes reptile zoo pet pets captivity
    island temple trip itinerary holiday vacation weekend kids children family daughter son mum
    mom dad grandma party restaurant history historical feelings feel book books movie film
    announcement backstory wedding birthday racconto racconti poesia favola lettera discorso
    biografia storia viaggio ricetta vacanza bambini famiglia figlia figlio cuento poema carta
    historia receta viaje hija hijo histoire poème lettre conte voyage fille fils geschichte
    gedicht brief rede kurzgeschichte reise tochter sohn"""
)

# ------------------------------------------------------------------------------- echo cues

# The object an edit verb points at: the pasted payload, or the previous turn.
DEICTIC_PHRASES: Final = words(
    """this these that those it them below above my questo questa questi queste quest' lo la
    este esta estos estas ce cet cette ces suivant diese diesen dieser dieses diesem folgende
    folgenden"""
) | {"the following", "il seguente", "la seguente", "el siguiente"}
DEICTIC_WORDS: Final = gate_words(DEICTIC_PHRASES)
DEICTIC: Final = alternation(DEICTIC_PHRASES) + r"\b"


# Verbs that by themselves mean "give me this text back, transformed".
TRANSFORM_VERBS: Final = words(
    """rewrite rephrase reword paraphrase proofread copyedit reformat reindent refactor rename
    transliterate redact anonymize anonymise censor alphabetize alphabetise reorder modernize
    modernise simplify restructure reorganize reorganise condense localize localise normalize
    normalise standardize standardise prettify beautify minify convert umschreiben corrige
    corriges corrigez renderlo renderla renderli rendilo rendila rendili"""
)
# Verbs that transform only when aimed at the payload ("convert this", "put these into").
AIMED_VERBS: Final = words(
    """transform turn put port migrate upgrade format sort polish adjust swap split metti mettete
    trasforma converti sistema sistemare sistemi convierte transforma pon mets mettez transforme
    convertis setze konvertiere wandle verwandle"""
)
WRITE_BACK_OBJECTS: Final = frozenset({"this", "it", "these", "that", "the following"})
# Form-only edits, whatever verb introduces them ("a once-over for typos").
FORM_VERBS: Final = words("fix correct clean tidy improve sistema sistemare check")
FORM_OBJECTS: Final = words(
    """grammar spelling typo typos punctuation mistakes indentation formatting format wording
    style english italian capitalization capitalisation punteggiatura grammatica ortografia
    ortografía orthographe"""
)
FORM_OBJECT_STEMS: Final = ("rechtschreib",)
FORM_NOUNS: Final = words(
    """typo typos grammar spelling spellings punctuation capitalization capitalisation docstring
    docstrings grammatica punteggiatura ortografia ortografía orthographe rechtschreibung"""
)
ADD_VERBS: Final = words("add aggiungi añade agrega ajoute")
ADDED_THINGS: Final = words(
    """types tipi tipos documentation logging headings heading emojis emoji commenti comentarios
    commentaires annotazioni comments comment annotations annotation docstrings docstring"""
) | {"type hint", "type hints", "error handling", "gestione degli errori"}
REMOVE_VERBS: Final = words(
    "remove strip delete drop rimuovi togli elimina quita supprime entferne"
)
REMOVE_FROM: Final = words("from da dal dalla de du aus")
REMOVED_THINGS: Final = words(
    "comment comments duplicates whitespace emoji emojis timestamps commenti duplicati"
) | {"blank lines", "empty lines", "line numbers", "print statements"}
REPLACE_VERBS: Final = words("replace replacing replaces")
SAME_WORDS: Final = words("stesso stessa misma mismo même gleiche gleichen")
BUT_WORDS: Final = words("ma pero mais aber")
SAME_ASPECTS: Final = words("content wording structure layout meaning")
MAKE_COMPARATIVES: Final = words(
    """more less shorter longer simpler clearer easier friendlier punchier sound formal polite
    concise"""
)
APPLY_VERBS: Final = words("apply applica aplica applique")
APPLY_DETERMINERS: Final = words("this the these questa la le este ce cette")
APPLIED_THINGS: Final = words("diff patch change changes modifiche")
RETURN_VERBS: Final = words("return give output show send print reply")
WHOLE_ADJECTIVES: Final = words(
    "full whole entire complete updated modified corrected edited rewritten"
)
WHOLE_OBJECTS: Final = words(
    "file code function class program text script module version workflow document query"
)
BACK_VERBS: Final = words("give send hand say read write type")
RESULT_VERBS: Final = words("give show return send")
UNCHANGED_WORDS: Final = words("throughout durchgehend verbatim unchanged unverändert")
LIST_FORMS: Final = words("tabella lista elenco ordine")
GERMAN_REPHRASE: Final = words("formuliere schreibe")
GERMAN_ADDED_STEMS: Final = ("kommentar", "dokumentation", "typ")
# Generic edit verbs: echo only when nothing suggests a bug hunt.
EDIT_VERBS: Final = words(
    """fix correct improve edit tidy clean modify update shorten simplify change tweak revise
    migliora modifica cambia mejora améliore modifie ändere verbessere überarbeite"""
)

# (trigger words, regex tried with .match at each trigger, strong)
ECHO_RULES: Final[tuple[tuple[frozenset[str], str, bool], ...]] = (
    (TRANSFORM_VERBS, r"\w+", True),
    (AIMED_VERBS, r"\w+\b[^.\n?]{0,40}?\b" + DEICTIC, True),
    (frozenset({"write"}), r"write " + alternation(WRITE_BACK_OBJECTS) + r"\b", True),
    (FORM_VERBS, r"\w+\b[^.\n]{0,30}" + bounded(FORM_OBJECTS, FORM_OBJECT_STEMS), True),
    (FORM_NOUNS, r"\w+", True),
    (
        ADD_VERBS,
        r"\w+\b[^.\n]{0,30}" + bounded(ADDED_THINGS, ()) + r"|\w+\b[^.\n]{0,30}\w*doc\b",
        True,
    ),
    (
        REMOVE_VERBS,
        r"\w+\b[^.\n]{0,40}"
        + bounded(REMOVE_FROM)
        + r"\s+"
        + DEICTIC
        + r"|\w+\b[^.\n]{0,30}"
        + bounded(REMOVED_THINGS),
        True,
    ),
    (REPLACE_VERBS, r"\w+\b[^.\n]{1,80}\b(?:with|by)\b", True),
    (
        frozenset({"same"}),
        r"same (?:\w+ ){0,2}(?:but|in|with)\b|same " + bounded(SAME_ASPECTS),
        True,
    ),
    (SAME_WORDS, r"\w+\b[^.\n]{0,20}" + bounded(BUT_WORDS), True),
    (
        frozenset({"make"}),
        r"make\s+" + DEICTIC + r"(?:\s+[\w-]+){0,2}\s+" + bounded(MAKE_COMPARATIVES),
        True,
    ),
    (
        APPLY_VERBS,
        r"\w+\s+" + alternation(APPLY_DETERMINERS) + r"\s+(?:\w+\s+)?" + bounded(APPLIED_THINGS),
        True,
    ),
    (
        RETURN_VERBS,
        r"(?:reply with|\w+)\b[^.\n]{0,25}"
        + bounded(WHOLE_ADJECTIVES)
        + r"\s+(?:\w+\s+)?"
        + bounded(WHOLE_OBJECTS),
        True,
    ),
    (BACK_VERBS, r"\w+\b[^.\n]{0,30}\bback\b", True),
    (frozenset({"return"}), r"return (?:it|them)\b", True),
    (RESULT_VERBS, r"\w+ (?:me )?(?:back )?the (?:result|new version)\b", True),
    (UNCHANGED_WORDS, r"\w+", True),
    (frozenset({"metti"}), r"metti\b[^.\n]{0,40}\bin (?:una |un )?" + bounded(LIST_FORMS), True),
    (GERMAN_REPHRASE, r"\w+\b[^.\n]{0,80}\bum\b", True),
    (
        frozenset({"füge"}),
        r"füge\b[^.\n]{0,60}" + alternation((), GERMAN_ADDED_STEMS) + r"[^.\n]{0,20}\bhinzu\b",
        True,
    ),
    (EDIT_VERBS, r"\w+(?: up)?\b[^.\n?]{0,40}?\b" + DEICTIC, False),
)

# Fixed phrases that mean "the same text back, changed": found with a substring test, which
# is far cheaper than trying a regex at every "as" or "on".
ECHO_PHRASES: Final = (
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
ECHO_PHRASE_INDEX: Final = PhraseIndex(ECHO_PHRASES)
# Stems (Italian/Spanish/German inflections, clitics): found with a substring test.
ECHO_STEMS: Final = tuple(
    """translat riscriv riformul corregg tradu tradú riformatt restituisci ripet semplific reescr
    reformul corrij réécri übersetz korrigier formatier""".split()
)

# Explicit repetition: "repeat this five times", "repeat after me:", "echo it back".
REPEAT_VERBS: Final = words(
    "repeat ripeti repite répète wiederhole say write scrivi escribe écris schreibe type"
)
NUMBER_WORDS: Final = words(
    """two three four five six seven eight nine ten twenty fifty hundred due tre quattro cinque
    sei sette otto nove dieci venti cinquanta cento dos tres cuatro cinco seis diez veinte cien
    deux trois quatre cinq dix vingt cent zwei drei vier fünf zehn zwanzig hundert"""
)
TIMES_WORDS: Final = words("times volte veces fois mal")
REPEAT_OBJECTS: Final = frozenset({"this", "the following", "back"})
RIPETI_OBJECTS: Final = frozenset({"questa", "questo", "il seguente", "la seguente"})
COPY_OBJECTS: Final = frozenset({"the following", "this", "these", "it"})
ECHO_EXPLICIT: Final = (
    bounded(REPEAT_VERBS)
    + r"[^\n]{0,120}?(?<![\w.])(?:\d+|"
    + alternation(NUMBER_WORDS)
    + r")\s*"
    + bounded(TIMES_WORDS)
    + r"|\brepeat after me\s*[:,\-–\"“«']"
    + r"|\brepeat "
    + bounded(REPEAT_OBJECTS)
    + r"|\bripeti "
    + alternation(RIPETI_OBJECTS)
    + r"|\bcopy (?:out |back )?"
    + bounded(COPY_OBJECTS)
    + r"|\becho (?:it |this |that |the following |the \w+ )?back\b"
)
EXPLICIT_GATE: Final = TIMES_WORDS | words("repeat ripeti copy echo")

# A sentence that opens with a question word, or ends in "?" without being a polite request
# ("can you...", "puoi..."), asks about the payload rather than for it back.
QUESTION_OPENERS: Final = words(
    """what why how which where when who is are does do did should cosa come quale quali dove
    qué cómo cuál pourquoi comment quel quelle est-ce warum wie was welche perché perche"""
) | {"can this", "can it", "can i", "can we", "could this", "could it", "could i", "could we",
     "che cosa", "por qué"}  # fmt: skip
POLITE_PREFIXES: Final = words("please pls ok okay so and now hey hi")
REQUEST_OPENERS: Final = words(
    "puoi potresti può potete puedes podrías peux-tu pourrais-tu pouvez-vous pourriez-vous"
) | {
    "can you", "could you", "would you", "will you", "mi puoi", "mi potresti", "me puedes",
    "kannst du", "könntest du", "können sie", "könnten sie",
}  # fmt: skip
QUESTION_OPENER: Final = r"\s*" + bounded(QUESTION_OPENERS)
REQUEST_OPENER: Final = (
    r"\s*(?:" + alternation(POLITE_PREFIXES) + r"[,!]?\s+)*" + bounded(REQUEST_OPENERS)
)
SENTENCE: Final = r"[^.!?\n]+[.!?]?"
SENTENCE_END: Final = r"[.!?\n]"

# Asking about a payload, or for something new made from it, rather than for it back.
ANALYSIS_WORDS: Final = words(
    """feedback opinion opinions opinione thoughts think agree continue test tests idea ideas
    meaning significato compare confronta reply respond answer rispondi responde réponds antworte
    headline tagline slogan caption hashtag hashtags keywords"""
)
ANALYSIS_STEMS: Final = tuple(
    """explain spieg explic expliq erklär summar riassum resum résum zusammen review critique
    critic analy anali assess evaluat valuta suggest recommend consigli continua extract estra
    title titol""".split()
)
DEBUG_WORDS: Final = words(
    "error errors exception traceback bug bugs broken wrong why warning panic"
)
DEBUG_SUBSTRINGS: Final = ("crash", "fail", "doesn't work", "doesnt work", "not working")
CREATE_VERBS: Final = words(
    """write draft compose create generate produce propose implement build scrivi crea genera
    proponi implementa escribe redacta écris rédige génère crée schreibe erstelle verfasse
    implementiere"""
)
NEW_DETERMINERS: Final = words(
    """a an some few one two three four five ten un una uno dei delle degli unos unas une des
    ein eine einen"""
)
CREATE_NEW: Final = r"\w+\s+(?:me\s+|mi\s+)?(?:\d+|" + alternation(NEW_DETERMINERS) + r")\b"
PRESENTATIONAL_PHRASES: Final = frozenset(
    {"here's", "heres", "here is", "here are", "this is", "these are", "ecco", "voici",
     "hier ist", "aquí está"}
)  # fmt: skip
PRESENTATIONAL: Final = r"\s*" + bounded(PRESENTATIONAL_PHRASES) + r"[^.!?\n,;]*[:.]?\s*$"

# Asking for new code: a creation verb, then a code noun in the same sentence.
CODE_NOUNS: Final = words(
    """function functions class script program query regex endpoint endpoints api hook decorator
    module workflow dockerfile makefile cli test tests component server one-liner snippet code
    funzione classe programma función clase fonction funktion klasse skript programm"""
)
CODE_NOUN_WORDS: Final = gate_words(CODE_NOUNS)
WRITE_VERBS: Final = CREATE_VERBS | words("give show make explain")
CODE_WRITE: Final = r"(?:(?:give|show|make) me|(?!give|show|make)\w+)\b[^.\n]{0,60}" + bounded(
    CODE_NOUNS
)

PROSE_NOUNS: Final = words(
    """story stories poem sonnet haiku limerick letter email e-mail mail essay toast speech post
    announcement note message review biography backstory lyrics song racconto poesia lettera
    discorso biografia cuento poema carta histoire poème lettre geschichte gedicht brief rede"""
)
PROSE_NOUN_WORDS: Final = gate_words(PROSE_NOUNS)
PROSE_VERBS: Final = words(
    "write compose draft create tell give scrivi racconta componi escribe écris schreibe"
)
PROSE_WRITE: Final = r"(?:give me|(?!give)\w+)\b[^.\n]{0,40}" + bounded(PROSE_NOUNS)
NARRATIVE_PHRASES: Final = (
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
NARRATIVE_INDEX: Final = PhraseIndex(NARRATIVE_PHRASES)
DECADE: Final = r"[0-9]{4}s\b"
# Language names that are ordinary words elsewhere count after "in", "using"...
AMBIGUOUS_LANGS: Final = words("go c r java rust swift ruby shell dart julia elixir zig ocaml")
LANG_PREPOSITIONS: Final = ("in", "using", "with", "con", "en", "mit", "per")
LANG_PHRASES: Final = {
    lang: tuple(f"{prep} {lang}" for prep in LANG_PREPOSITIONS) for lang in AMBIGUOUS_LANGS
}
CS_PHRASES: Final = (
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
CS_INDEX: Final = PhraseIndex(CS_PHRASES)
# An explicit change of subject cancels the coding context of the session.
TOPIC_RESET_PHRASES: Final = (
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
TOPIC_RESET_INDEX: Final = PhraseIndex(TOPIC_RESET_PHRASES)


# ------------------------------------------------------------------------------- compiled


def _compile_rules(
    rules: Iterable[tuple[frozenset[str], str, bool]],
) -> dict[str, list[tuple[re.Pattern[str], bool]]]:
    """Rule regexes indexed by trigger word."""
    index: dict[str, list[tuple[re.Pattern[str], bool]]] = {}
    for triggers, regex, strong in rules:
        pattern = re.compile(regex)
        for word in triggers:
            index.setdefault(word, []).append((pattern, strong))
    return index


ECHO_RULE_INDEX: Final = _compile_rules(ECHO_RULES)
ECHO_RULE_WORDS: Final = frozenset(ECHO_RULE_INDEX)
ECHO_EXPLICIT_RE: Final = re.compile(ECHO_EXPLICIT)
QUESTION_OPENER_RE: Final = re.compile(QUESTION_OPENER)
REQUEST_OPENER_RE: Final = re.compile(REQUEST_OPENER)
SENTENCE_RE: Final = re.compile(SENTENCE)
SENTENCE_END_RE: Final = re.compile(SENTENCE_END)
CREATE_NEW_RE: Final = re.compile(CREATE_NEW)
PRESENTATIONAL_RE: Final = re.compile(PRESENTATIONAL)
CODE_WRITE_RE: Final = re.compile(CODE_WRITE)
PROSE_WRITE_RE: Final = re.compile(PROSE_WRITE)
DECADE_RE: Final = re.compile(DECADE)
