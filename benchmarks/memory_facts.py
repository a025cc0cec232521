"""The memory-recall benchmark's data: generated facts and paraphrased questions, seeded, offline.

Why generated: a recall benchmark needs many facts whose right answer is known, questions that say
the same thing in other words (a keyword index alone must not be able to answer them), and hard
negatives: facts about the *same* subject, so the subject's name alone does not find the answer.
Every subject (a person, a project, a server, a town) has many relations (car, home town, job,
budget, memory size...); each fact states one relation in one of a few phrasings, and its question
asks for the same relation with synonyms ("automobile" for "car", "profession" for "works as").
Questions share the subject's name with their fact and, as far as the templates manage, no other
content word: `overlap_report` measures how far.

A data set of `size` entries holds the `questions` target facts (half the relations of a few dozen
subjects), then the other facts of those subjects (hard negatives: same name, another relation),
then facts of other subjects (same relation, another name); sizes are prefixes of one seeded
order, so the 1k set is a subset of the 10k set and both are asked the same questions.

    python benchmarks/memory_facts.py [--size 1000] [--questions 500] [--seed 11]
prints the counts, the keyword-overlap fraction and a few examples.
"""

from __future__ import annotations

import argparse
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["Dataset", "Fact", "Question", "build_universe", "content_words", "dataset", "overlap_report"]

Values = Callable[[random.Random], dict[str, str]]


def _split(text: str, sep: str | None = None) -> list[str]:
    """Word lists are written as one string each (compact and easy to extend)."""
    return text.split(sep)


@dataclass(frozen=True)
class Fact:
    """One memory entry: `fact_id` is its entry id, `subject` the name a question shares with it."""

    fact_id: str
    subject: str
    kind: str  # person | project | host | town
    relation: str
    text: str
    question: str


@dataclass(frozen=True)
class Question:
    text: str
    answer_id: str
    relation: str
    subject: str


@dataclass(frozen=True)
class Dataset:
    entries: list[Fact]
    questions: list[Question]


@dataclass(frozen=True)
class Relation:
    name: str
    kind: str
    facts: tuple[str, ...]  # phrasings of the fact, formatted with {n} and the values
    questions: tuple[str, ...]  # phrasings of the question, formatted with {n} only
    values: Values


def _pick(*names_and_lists: tuple[str, Sequence[str]]) -> Values:
    def draw(rng: random.Random) -> dict[str, str]:
        return {name: rng.choice(options) for name, options in names_and_lists}

    return draw


def _number(name: str, low: int, high: int, step: int = 1) -> tuple[str, Sequence[str]]:
    return name, [str(v) for v in range(low, high + 1, step)]


FIRST = _split(
    "Ada Bruno Celia Dmitri Elena Farid Greta Hamid Ingrid Jonas Keiko Lars Mina Nikolai Olga Pavel "
    "Quentin Rosa Stefan Tamsin Ulrich Vera Wendell Ximena Yusuf Zora Amara Bastian Carmen Desmond "
    "Esther Florian Gideon Hilde Ismael Juno Kasimir Leona Matteo Noor Otto Petra Rafael Saskia "
    "Thaddeus Ursula Viktor Wilma Yara Zeno"
)
LAST = _split(
    "Abernathy Bellamy Castellano Dunmore Eskildsen Fairweather Galloway Hargreaves Ivanova Jablonski "
    "Kowalczyk Lindqvist Montague Nakamura Okonkwo Pemberton Quintero Rasmussen Sorensen Thornbury "
    "Underhill Vasquez Whitlock Yamamoto Zielinski Achterberg Blackwood Cardenas Delacroix Ellingham"
)
PROJECTS = _split(
    "Orion Kestrel Bluebird Tamarack Juniper Halcyon Meridian Sparrowhawk Tundra Wildfire Sequoia "
    "Aurora Basilisk Cobalt Driftwood Ember Fjord Granite Harrier Icefall Jasper Kingfisher Lodestar "
    "Monsoon Nightjar Obsidian Pelican Quasar Redwood Solstice Tempest Umbra Vortex Willow Xenon "
    "Yarrow Zephyr Anvil Beacon Cinder Dynamo Equinox Falconer Glacier Heron Ironwood Jackal Kodiak "
    "Lantern Magpie Nebula Oriole Pinnacle Quill Raven Saffron Thistle Upland Vesper Wombat"
)
HOSTS = _split(
    "alder birch cedar dogwood elm fir ginkgo hazel ironbark juniper kauri larch maple nutmeg oak "
    "pine quince rowan spruce teak"
)
TOWN_START = _split("Ash Bram Cold Dun Elm Fair Glen Holl Kirk Lang Marsh Nor Oak Pen Red Stan Thorn Wick")
TOWN_END = _split("bury ford ham ley mouth stead ton wick")

COLORS = _split("crimson teal silver mustard olive navy maroon ivory charcoal turquoise lilac bronze")
CITIES = _split(
    "Lisbon Krakow Montreal Osaka Nairobi Valparaiso Tbilisi Reykjavik Hanoi Marrakesh Bergen Porto "
    "Adelaide Cusco Gdansk Ljubljana Mombasa Quito Tallinn Zanzibar"
)
JOBS = _split(
    "carpenter,pharmacist,translator,surveyor,veterinarian,locksmith,actuary,midwife,cartographer,"
    "plumber,librarian,geologist,baker,electrician,optician,welder,archivist,dentist",
    ",",
)
PETS = _split("tortoise,ferret,parrot,dachshund,iguana,hamster,beagle,rabbit,cockatoo,goldfish", ",")
PET_NAMES = _split("Biscuit Pepper Noodle Ziggy Mochi Clover Pickles Waffles Sprocket Tofu")
DISHES = _split(
    "lasagne,pad thai,ramen,paella,goulash,falafel,risotto,pierogi,moussaka,ceviche,biryani,"
    "shakshuka,jambalaya,bibimbap",
    ",",
)
INSTRUMENTS = _split("cello,oboe,banjo,harp,trombone,accordion,ukulele,clarinet,bagpipes,sitar,tuba", ",")
LANGUAGES = _split("Portuguese,Icelandic,Swahili,Tagalog,Hungarian,Welsh,Finnish,Korean,Basque,Amharic", ",")
MONTHS = _split("January February March April May June July August September October November December")
SPORTS = _split("fencing,rowing,badminton,curling,squash,lacrosse,archery,judo,water polo,bouldering", ",")
ALLERGENS = _split("peanuts,shellfish,penicillin,bee stings,pollen,latex,sesame,cat dander", ",")
FEARS = _split("spiders,heights,thunderstorms,clowns,deep water,snakes,elevators,crowds", ",")
COLLECTIBLES = _split(
    "stamps,vinyl records,seashells,antique maps,postcards,fountain pens,comic books,coins", ","
)
SUBJECTS = _split("chemistry,philosophy,economics,linguistics,astronomy,architecture,botany,statistics", ",")
DRINKS = _split("espresso,green tea,kombucha,hot chocolate,oat milk latte,yerba mate,rooibos", ",")
AUTHORS = _split("Tolstoy,Le Guin,Murakami,Austen,Borges,Achebe,Atwood,Calvino,Dostoevsky,Morrison", ",")
COUNTRIES = _split("Portugal,Vietnam,Peru,Norway,Morocco,Georgia,Chile,Estonia,Tanzania,Mongolia", ",")
GENRES = _split("horror,documentary,western,science fiction,romantic comedy,noir,animated,musical", ",")
PLANTS = _split("tomatoes,lavender,pumpkins,orchids,strawberries,sunflowers,basil,chillies", ",")
COMPANIES = _split(
    "Northwind Logistics,Bluepeak Insurance,Harbor Mills,Quartz Analytics,Larkspur Foods,"
    "Ironclad Security,Tidewater Energy,Copperleaf Media",
    ",",
)
COMMUTES = _split(
    "rides a bicycle to the office,takes the subway to the office,walks to the office,"
    "catches the bus to the office,takes the ferry to the office,rollerblades to the office",
    ",",
)
PROG_LANGS = _split("Rust,Haskell,Go,Kotlin,Elixir,OCaml,Scala,Zig,Clojure,Fortran", ",")
OSES = _split("FreeBSD,Debian,Alpine Linux,Fedora,OpenBSD,Ubuntu,Arch Linux,Rocky Linux", ",")
RIVERS = _split("Wyre,Tamar,Calder,Severn,Ouse,Derwent,Avon,Kennet,Medway,Tees", ",")

RELATIONS: tuple[Relation, ...] = (
    Relation(
        "car",
        "person",
        ("{n} owns a {color} car.", "{n} drives a {color} hatchback."),
        ("What kind of automobile does {n} have?", "Which vehicle belongs to {n}?"),
        _pick(("color", COLORS)),
    ),
    Relation(
        "hometown",
        "person",
        ("{n} grew up in {city}.", "{n} spent childhood years in {city}."),
        ("Where was {n} raised?", "What is the place of origin of {n}?"),
        _pick(("city", CITIES)),
    ),
    Relation(
        "job",
        "person",
        ("{n} works as a {job}.", "{n} is a {job} by trade."),
        ("What is the profession of {n}?", "What does {n} do for a living?"),
        _pick(("job", JOBS)),
    ),
    Relation(
        "pet",
        "person",
        ("{n} has a {pet} called {pet_name}.", "{n} adopted a {pet} named {pet_name}."),
        ("Which animal does {n} keep as a companion?", "What animal lives with {n}?"),
        _pick(("pet", PETS), ("pet_name", PET_NAMES)),
    ),
    Relation(
        "food",
        "person",
        ("{n}'s favourite dish is {dish}.", "{n} loves eating {dish}."),
        ("What meal does {n} enjoy most?", "Which food would {n} choose above all others?"),
        _pick(("dish", DISHES)),
    ),
    Relation(
        "instrument",
        "person",
        ("{n} plays the {instrument}.", "{n} practises the {instrument} every evening."),
        ("Which musical instrument does {n} perform on?", "What does {n} make music with?"),
        _pick(("instrument", INSTRUMENTS)),
    ),
    Relation(
        "language",
        "person",
        ("{n} speaks fluent {language}.", "{n} is fluent in {language}."),
        ("Which tongue can {n} converse in?", "What foreign language has {n} mastered?"),
        _pick(("language", LANGUAGES)),
    ),
    Relation(
        "birthday",
        "person",
        ("{n} was born in {month}.", "{n}'s birth date falls in {month}."),
        ("When does {n} celebrate a birthday?", "In which month does {n} turn a year older?"),
        _pick(("month", MONTHS)),
    ),
    Relation(
        "sport",
        "person",
        ("{n} practises {sport} at weekends.", "{n} competes in amateur {sport}."),
        ("Which athletic activity is {n} into?", "What game or exercise does {n} train for?"),
        _pick(("sport", SPORTS)),
    ),
    Relation(
        "allergy",
        "person",
        ("{n} is allergic to {allergen}.", "{n} has a severe allergy to {allergen}."),
        ("What is {n} intolerant of?", "What must {n} avoid for medical reasons?"),
        _pick(("allergen", ALLERGENS)),
    ),
    Relation(
        "fear",
        "person",
        ("{n} is afraid of {fear}.", "{n} has a phobia of {fear}."),
        ("What frightens {n}?", "What is {n} scared of?"),
        _pick(("fear", FEARS)),
    ),
    Relation(
        "floor",
        "person",
        ("{n}'s apartment is on floor {floor}.", "{n} rents a flat on level {floor}."),
        ("Which storey does {n} reside on?", "How high up is the home of {n}?"),
        _pick(_number("floor", 2, 30)),
    ),
    Relation(
        "siblings",
        "person",
        ("{n} has {k} brothers.", "{n} grew up with {k} brothers."),
        ("How many male siblings does {n} have?", "What is the count of boys in the family of {n}?"),
        _pick(_number("k", 2, 6)),
    ),
    Relation(
        "commute",
        "person",
        ("{n} {commute}.", "Each morning {n} {commute}."),
        ("How does {n} travel to the workplace?", "What is the daily journey to work like for {n}?"),
        _pick(("commute", COMMUTES)),
    ),
    Relation(
        "hobby",
        "person",
        ("{n} collects {collectible}.", "{n} keeps a large collection of {collectible}."),
        ("What does {n} gather as a hobby?", "Which items does {n} hoard for fun?"),
        _pick(("collectible", COLLECTIBLES)),
    ),
    Relation(
        "colour",
        "person",
        ("{n}'s favourite colour is {color}.", "{n} likes the colour {color} best."),
        ("Which hue does {n} prefer?", "What shade appeals most to {n}?"),
        _pick(("color", COLORS)),
    ),
    Relation(
        "degree",
        "person",
        ("{n} studied {subject} at university.", "{n} holds a degree in {subject}."),
        ("What was the academic major of {n}?", "Which field did {n} specialise in at college?"),
        _pick(("subject", SUBJECTS)),
    ),
    Relation(
        "drink",
        "person",
        ("{n} drinks {drink} every morning.", "{n} starts each day with {drink}."),
        ("What beverage does {n} have at breakfast?", "What does {n} like to sip at breakfast time?"),
        _pick(("drink", DRINKS)),
    ),
    Relation(
        "author",
        "person",
        ("{n}'s favourite writer is {author}.", "{n} rereads the novels of {author}."),
        ("Which novelist does {n} admire most?", "Whose books does {n} return to again and again?"),
        _pick(("author", AUTHORS)),
    ),
    Relation(
        "age",
        "person",
        ("{n} is {age} years old.", "{n} turned {age} this year."),
        ("What is the age of {n}?", "How long has {n} been alive?"),
        _pick(_number("age", 21, 79)),
    ),
    Relation(
        "height",
        "person",
        ("{n} is {h} centimetres tall.", "{n} measures {h} cm in height."),
        ("How high does {n} stand?", "What is the stature of {n}?"),
        _pick(_number("h", 150, 199)),
    ),
    Relation(
        "salary",
        "person",
        ("{n} earns {k} thousand dollars a year.", "{n} is paid {k}k dollars annually."),
        ("What is the yearly income of {n}?", "How much money does {n} make per annum?"),
        _pick(_number("k", 30, 180, 5)),
    ),
    Relation(
        "travel",
        "person",
        ("{n} visited {country} last summer.", "{n} spent a holiday in {country} in August."),
        ("Which nation did {n} tour on vacation?", "Where did {n} go on a trip abroad?"),
        _pick(("country", COUNTRIES)),
    ),
    Relation(
        "shoes",
        "person",
        ("{n} wears size {k} shoes.", "{n} buys boots in size {k}."),
        ("How big are the feet of {n}?", "What footwear fits {n}?"),
        _pick(_number("k", 36, 47)),
    ),
    Relation(
        "movies",
        "person",
        ("{n} loves watching {genre} movies.", "{n} is a big fan of {genre} films."),
        ("What type of cinema does {n} enjoy?", "Which picture genre is {n} keen on?"),
        _pick(("genre", GENRES)),
    ),
    Relation(
        "garden",
        "person",
        ("{n} grows {plant} in the garden.", "{n} plants {plant} in the backyard every spring."),
        ("What does {n} cultivate outdoors?", "Which crops or flowers does {n} tend?"),
        _pick(("plant", PLANTS)),
    ),
    Relation(
        "employer",
        "person",
        ("{n} is employed by {company}.", "{n} has a job at {company}."),
        ("Which firm does {n} work for?", "Which company is {n} on the payroll of?"),
        _pick(("company", COMPANIES)),
    ),
    Relation(
        "wakeup",
        "person",
        ("{n} gets up at {hour} o'clock sharp.", "{n}'s alarm rings at {hour} a.m."),
        ("When does {n} wake?", "At what time does {n} rise in the morning?"),
        _pick(_number("hour", 4, 9)),
    ),
    Relation(
        "budget",
        "project",
        ("The {n} project has a budget of {k} thousand dollars.", "{n} was granted {k}k dollars of funding."),
        ("How much money was allocated to {n}?", "What spending limit applies to {n}?"),
        _pick(_number("k", 20, 900, 10)),
    ),
    Relation(
        "deadline",
        "project",
        ("The {n} project is due on {month} {day}.", "{n} must ship by {month} {day}."),
        ("When is {n} supposed to be finished?", "What is the delivery date for {n}?"),
        _pick(("month", MONTHS), _number("day", 1, 28)),
    ),
    Relation(
        "codebase",
        "project",
        ("The {n} codebase is written in {lang}.", "{n} is implemented in {lang}."),
        ("Which programming language does {n} use?", "What was {n} coded with?"),
        _pick(("lang", PROG_LANGS)),
    ),
    Relation(
        "lead",
        "project",
        ("{first} {last} leads the {n} project.", "{first} {last} is the manager of {n}."),
        ("Who is in charge of {n}?", "Who heads {n}?"),
        _pick(("first", FIRST), ("last", LAST)),
    ),
    Relation(
        "ram",
        "host",
        ("Server {n} has {k} gigabytes of RAM.", "The host {n} is fitted with {k} GB of RAM."),
        ("How much memory is installed on machine {n}?", "What is the memory capacity of {n}?"),
        _pick(("k", ["8", "16", "32", "64", "128", "256", "512"])),
    ),
    Relation(
        "os",
        "host",
        ("Server {n} runs {os}.", "The host {n} boots {os}."),
        ("Which operating system is on machine {n}?", "What platform software powers {n}?"),
        _pick(("os", OSES)),
    ),
    Relation(
        "site",
        "host",
        ("Server {n} is racked in the {city} data centre.", "The host {n} sits in a {city} rack."),
        ("Where is machine {n} physically located?", "In which facility can {n} be found?"),
        _pick(("city", CITIES)),
    ),
    Relation(
        "population",
        "town",
        ("{n} has a population of {k} thousand.", "About {k},000 residents live in {n}."),
        ("How many people inhabit {n}?", "How large is the citizenry of {n}?"),
        _pick(_number("k", 3, 95)),
    ),
    Relation(
        "river",
        "town",
        ("The {river} River flows through {n}.", "{n} sits on the banks of the {river}."),
        ("Which waterway crosses {n}?", "What stream runs past {n}?"),
        _pick(("river", RIVERS)),
    ),
)


def _subjects() -> dict[str, list[str]]:
    towns = [a + b for a in TOWN_START for b in TOWN_END]
    return {
        "person": [f"{f} {la}" for f in FIRST for la in LAST],  # 1,500 people
        "project": list(PROJECTS),
        "host": [f"{h}-{i:02d}" for h in HOSTS for i in range(1, 9)],
        "town": towns,
    }


def build_universe(seed: int = 11) -> list[Fact]:
    """Every (subject, relation) fact, each with its phrasing and question drawn from `seed`."""
    rng = random.Random(seed)
    subjects = _subjects()
    facts: list[Fact] = []
    for relation in RELATIONS:
        for subject in subjects[relation.kind]:
            values = relation.values(rng)
            text = rng.choice(relation.facts).format(n=subject, **values)
            question = rng.choice(relation.questions).format(n=subject)
            fact_id = f"f{len(facts):05d}"
            facts.append(Fact(fact_id, subject, relation.kind, relation.name, text, question))
    return facts


# which kind of subject the next target subject is: mostly people (they have the most relations)
KIND_CYCLE = ("person", "project", "person", "host", "person", "town", "person")


def dataset(size: int, questions: int = 500, seed: int = 11) -> Dataset:
    """`size` entries holding the answers to `questions` questions, then hard negatives, then
    other facts. Questions come in groups per subject: half of a subject's relations are asked
    about, the other half are its hard negatives, so in every data set a question's subject has
    many facts and its name alone does not single out the answer. Deterministic in `seed`; a
    smaller size is a prefix of a larger one's entries, asked the same questions."""
    if questions > size:
        raise ValueError(f"questions ({questions}) must not exceed size ({size})")
    universe = build_universe(seed)
    if size > len(universe):
        raise ValueError(f"size {size} exceeds the {len(universe)} facts the templates can generate")
    rng = random.Random(seed + 1)
    by_subject: dict[str, list[Fact]] = {}
    for fact in universe:
        by_subject.setdefault(fact.subject, []).append(fact)
    by_kind: dict[str, list[str]] = {}
    for subject, facts in by_subject.items():
        by_kind.setdefault(facts[0].kind, []).append(subject)
    for subjects in by_kind.values():
        rng.shuffle(subjects)
    targets: list[Fact] = []
    hard: list[Fact] = []
    used: set[str] = set()
    cursors = dict.fromkeys(by_kind, 0)
    turn = 0
    while len(targets) < questions:
        if all(cursors[k] >= len(by_kind[k]) for k in by_kind):
            raise ValueError(f"only {len(targets)} questions can be drawn")
        kind = KIND_CYCLE[turn % len(KIND_CYCLE)]
        turn += 1
        if cursors[kind] >= len(by_kind[kind]):
            continue
        subject = by_kind[kind][cursors[kind]]
        cursors[kind] += 1
        facts = list(by_subject[subject])
        rng.shuffle(facts)
        asked = min((len(facts) + 1) // 2, questions - len(targets))
        targets += facts[:asked]
        hard += facts[asked:]
        used.add(subject)
    other = [f for f in universe if f.subject not in used]
    rng.shuffle(hard)
    rng.shuffle(other)
    entries = (targets + hard + other)[:size]
    order = random.Random(seed + 2)
    shuffled = list(entries)
    order.shuffle(shuffled)  # ingestion order does not reveal which entries are answers
    return Dataset(
        entries=shuffled,
        questions=[Question(f.question, f.fact_id, f.relation, f.subject) for f in targets],
    )


STOPWORDS = frozenset(
    _split(
        "a about above after again all am an and any are as at be been being below between both but by "
        "can could did do does doing down during each few for from further had has have having he her "
        "here hers him his how i if in into is it its itself just me more most my no nor not of off on "
        "once only or other our out over own same she should so some such than that the their them then "
        "there these they this those through to too under until up very was we were what when where "
        "which while who whom whose why will with would you your s"
    )
)


def _stem(word: str) -> str:
    for suffix in ("ing", "ed", "es", "s"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            return word[: -len(suffix)]
    return word


def content_words(text: str, drop: str = "") -> set[str]:
    """Lowercase stemmed words of `text` that are not stopwords nor words of `drop` (a name)."""
    skip = {_stem(w) for w in re.findall(r"[a-z0-9]+", drop.lower())}
    words = {_stem(w) for w in re.findall(r"[a-z0-9]+", text.lower()) if w not in STOPWORDS}
    return words - skip - {""}


def overlap_report(data: Dataset) -> dict:
    """How many questions share a content word (beyond the subject's name) with their answer."""
    texts = {f.fact_id: f for f in data.entries}
    shared: list[tuple[str, str, list[str]]] = []
    for q in data.questions:
        fact = texts[q.answer_id]
        common = content_words(q.text, q.subject) & content_words(fact.text, q.subject)
        if common:
            shared.append((q.text, fact.text, sorted(common)))
    return {
        "questions": len(data.questions),
        "sharing_a_content_word": len(shared),
        "fraction": len(shared) / max(1, len(data.questions)),
        "examples": shared[:5],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", type=int, default=1000)
    parser.add_argument("--questions", type=int, default=500)
    parser.add_argument("--seed", type=int, default=11)
    args = parser.parse_args()
    universe = build_universe(args.seed)
    data = dataset(args.size, args.questions, args.seed)
    report = overlap_report(data)
    print(
        f"universe: {len(universe)} facts over {len(RELATIONS)} relations; distinct texts "
        f"{len({f.text for f in universe})}"
    )
    print(
        f"data set: {len(data.entries)} entries, {len(data.questions)} questions over "
        f"{len({q.relation for q in data.questions})} relations"
    )
    print(
        f"questions sharing a content word other than the name with their fact: "
        f"{report['sharing_a_content_word']}/{report['questions']} ({report['fraction']:.1%})"
    )
    for question, fact, common in report["examples"]:
        print(f"    {question!r} / {fact!r}: {', '.join(common)}")
    for q in data.questions[:8]:
        print(f"  Q {q.text}  ->  {next(f.text for f in data.entries if f.fact_id == q.answer_id)}")


if __name__ == "__main__":
    main()
