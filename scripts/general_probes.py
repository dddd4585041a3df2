#!/usr/bin/env python3
"""Writes data/eval/general.json: the eval gate's general probes (the `general` leg).

Facts, JSON, code and language prompts are written by hand below; arithmetic and unit conversions are drawn
by a seeded generator so every expected answer is exact. Rerun after editing; a base keeps the set frozen for
it on first use (DATA_DIR/eval/<base sha256>.general.json), so a change applies to new bases only.

    python3 scripts/general_probes.py > data/eval/general.json
"""

import json
import random

rng = random.Random(36)
probes = []


def add(pid, prompt, check):
    probes.append({"id": pid, "prompt": prompt, "check": check})


# Facts: the first line must name one of the accepted answers.
FACTS = [
    ("capital-france", "What is the capital of France?", ["Paris"]),
    ("capital-germany", "What is the capital of Germany?", ["Berlin"]),
    ("capital-italy", "What is the capital of Italy?", ["Rome", "Roma"]),
    ("capital-spain", "What is the capital of Spain?", ["Madrid"]),
    ("capital-japan", "What is the capital of Japan?", ["Tokyo"]),
    ("capital-uk", "What is the capital of the United Kingdom?", ["London"]),
    ("capital-canada", "What is the capital of Canada?", ["Ottawa"]),
    ("capital-australia", "What is the capital of Australia?", ["Canberra"]),
    ("capital-egypt", "What is the capital of Egypt?", ["Cairo"]),
    ("capital-russia", "What is the capital of Russia?", ["Moscow"]),
    ("capital-china", "What is the capital of China?", ["Beijing", "Peking"]),
    ("capital-portugal", "What is the capital of Portugal?", ["Lisbon"]),
    ("capital-greece", "What is the capital of Greece?", ["Athens"]),
    ("capital-norway", "What is the capital of Norway?", ["Oslo"]),
    ("capital-kenya", "What is the capital of Kenya?", ["Nairobi"]),
    ("capital-argentina", "What is the capital of Argentina?", ["Buenos Aires"]),
    ("capital-poland", "What is the capital of Poland?", ["Warsaw"]),
    ("capital-ireland", "What is the capital of Ireland?", ["Dublin"]),
    ("capital-austria", "What is the capital of Austria?", ["Vienna"]),
    ("capital-sweden", "What is the capital of Sweden?", ["Stockholm"]),
    ("planet-red", "Which planet is known as the Red Planet?", ["Mars"]),
    ("planet-largest", "What is the largest planet in the solar system?", ["Jupiter"]),
    ("planet-closest-sun", "Which planet is closest to the Sun?", ["Mercury"]),
    ("planet-rings", "Which planet is famous for its large rings?", ["Saturn"]),
    ("water-formula", "What is the chemical formula of water?", ["H2O", "H₂O"]),
    ("gas-plants", "Which gas do plants absorb from the air for photosynthesis?", ["carbon dioxide", "CO2", "CO₂"]),
    ("symbol-gold", "What is the chemical symbol for gold?", ["Au"]),
    ("symbol-iron", "What is the chemical symbol for iron?", ["Fe"]),
    ("water-boils", "At how many degrees Celsius does water boil at sea level?", ["100"]),
    ("author-hamlet", "Who wrote Hamlet?", ["Shakespeare"]),
    ("author-1984", "Who wrote the novel 1984?", ["Orwell"]),
    ("author-quixote", "Who wrote Don Quixote?", ["Cervantes"]),
    ("painter-mona-lisa", "Who painted the Mona Lisa?", ["Leonardo", "da Vinci"]),
    ("composer-fifth", "Which composer wrote the Fifth Symphony that begins da-da-da-dum?", ["Beethoven"]),
    ("relativity", "Who developed the theory of relativity?", ["Einstein"]),
    ("gravity-apple", "Which scientist is famous for the story of an apple and gravity?", ["Newton"]),
    ("largest-ocean", "What is the largest ocean on Earth?", ["Pacific"]),
    ("longest-river-africa", "What is the longest river in Africa?", ["Nile"]),
    ("highest-mountain", "What is the highest mountain on Earth?", ["Everest"]),
    ("largest-desert-hot", "What is the largest hot desert in the world?", ["Sahara"]),
    ("continent-brazil", "On which continent is Brazil?", ["South America"]),
    ("continent-kenya", "On which continent is Kenya?", ["Africa"]),
    ("days-week", "How many days are in a week?", ["7", "seven"]),
    ("legs-spider", "How many legs does a spider have?", ["8", "eight"]),
    ("legs-insect", "How many legs does an insect have?", ["6", "six"]),
    ("sides-hexagon", "How many sides does a hexagon have?", ["6", "six"]),
    ("sides-triangle", "How many sides does a triangle have?", ["3", "three"]),
    ("months-year", "How many months are in a year?", ["12", "twelve"]),
    ("primary-sky", "What colour is a clear daytime sky?", ["blue"]),
    ("colour-grass", "What colour is healthy grass?", ["green"]),
    ("colour-mix", "Which colour do you get by mixing blue and yellow?", ["green"]),
    ("currency-japan", "What is the currency of Japan?", ["yen"]),
    ("currency-uk", "What is the currency of the United Kingdom?", ["pound"]),
    ("language-brazil", "What is the main language spoken in Brazil?", ["Portuguese"]),
    ("language-mexico", "What is the main language spoken in Mexico?", ["Spanish"]),
    ("organ-blood", "Which organ pumps blood through the body?", ["heart"]),
    ("largest-mammal", "What is the largest animal on Earth?", ["blue whale"]),
    ("fastest-land", "What is the fastest land animal?", ["cheetah"]),
    ("moon-landing", "In which year did humans first land on the Moon?", ["1969"]),
    ("ww2-end", "In which year did World War II end?", ["1945"]),
    ("opposite-hot", "What is the opposite of hot?", ["cold"]),
    ("plural-mouse", "What is the plural of mouse?", ["mice"]),
    ("past-go", "What is the past tense of the verb go?", ["went"]),
    ("sqrt-81", "What is the square root of 81?", ["9", "nine"]),
    ("prime-after-7", "What is the smallest prime number greater than 7?", ["11", "eleven"]),
    ("freezing-f", "At how many degrees Fahrenheit does water freeze?", ["32"]),
    ("speed-light-unit", "Is the speed of light closer to 300,000 km per second or 300 km per second?", ["300,000", "300000", "300 000"]),
    ("rust-lang-creator", "Which company first sponsored the Rust programming language?", ["Mozilla"]),
]
for pid, q, answers in FACTS:
    add(f"fact-{pid}", q + " Answer in a few words.", {"contains_any": answers})
# A fact whose answer is a digit another number contains ("100" holds "0"): read as a number.
add("fact-water-freezes", "At how many degrees Celsius does water freeze? Answer with the number only.",
    {"number": {"value": 0}})

# Arithmetic: exact integers; "the number only" keeps answers to a few tokens.
for i in range(16):
    a, b = rng.randint(11, 99), rng.randint(11, 99)
    add(f"add-{i}", f"What is {a} + {b}? Answer with the number only.", {"number": {"value": a + b}})
for i in range(8):
    a, b = rng.randint(50, 199), rng.randint(11, 49)
    add(f"sub-{i}", f"What is {a} - {b}? Answer with the number only.", {"number": {"value": a - b}})
for i in range(10):
    a, b = rng.randint(3, 19), rng.randint(3, 12)
    add(f"mul-{i}", f"What is {a} times {b}? Answer with the number only.", {"number": {"value": a * b}})
for i in range(6):
    b, q = rng.randint(2, 12), rng.randint(2, 15)
    add(f"div-{i}", f"What is {b * q} divided by {b}? Answer with the number only.", {"number": {"value": q}})

# Unit conversions: exact factors (metric, time, inches); Fahrenheit by formula.
UNITS = [
    ("km-m", "kilometres", "metres", 1000),
    ("m-cm", "metres", "centimetres", 100),
    ("cm-mm", "centimetres", "millimetres", 10),
    ("kg-g", "kilograms", "grams", 1000),
    ("l-ml", "litres", "millilitres", 1000),
    ("h-min", "hours", "minutes", 60),
    ("min-s", "minutes", "seconds", 60),
    ("day-h", "days", "hours", 24),
    ("week-day", "weeks", "days", 7),
    ("ft-in", "feet", "inches", 12),
    ("in-cm", "inches", "centimetres", 2.54),
    ("yd-ft", "yards", "feet", 3),
]
for i in range(24):
    pid, frm, to, factor = UNITS[i % len(UNITS)]
    n = rng.randint(2, 9)
    value = round(n * factor, 6)
    add(
        f"unit-{pid}-{i}",
        f"How many {to} are in {n} {frm}? Answer with the number only.",
        {"number": {"value": value, "tolerance": round(abs(value) * 0.005, 6)}},
    )
for i, c in enumerate([0, 10, 20, 25, 30, 40, 100]):
    f = c * 9 / 5 + 32
    add(f"unit-c-f-{i}", f"What is {c} degrees Celsius in degrees Fahrenheit? Answer with the number only.",
        {"number": {"value": f, "tolerance": 0.5}})

# JSON: short objects, so the answer fits the token budget.
JSON = [
    ("person", "Reply with only a JSON object with keys \"name\" and \"age\" for Alice, who is 30.", ["name", "age"]),
    ("city", "Reply with only a JSON object with keys \"city\" and \"country\" for Paris.", ["city", "country"]),
    ("book", "Reply with only a JSON object with keys \"title\" and \"year\" for the novel 1984.", ["title", "year"]),
    ("point", "Reply with only a JSON object with keys \"x\" and \"y\" for the point (3, 4).", ["x", "y"]),
    ("colour", "Reply with only a JSON object with key \"colour\" set to red.", ["colour"]),
    ("ok", "Reply with only a JSON object with key \"ok\" set to true.", ["ok"]),
    ("count", "Reply with only a JSON object with key \"count\" set to 5.", ["count"]),
    ("pet", "Reply with only a JSON object with keys \"animal\" and \"name\" for a dog called Rex.", ["animal", "name"]),
    ("temp", "Reply with only a JSON object with keys \"unit\" and \"value\" for 21 degrees Celsius.", ["unit", "value"]),
    ("fruit", "Reply with only a JSON object with key \"fruits\" holding a list of two fruits.", ["fruits"]),
    ("user", "Reply with only a JSON object with keys \"id\" and \"email\" for user 7 with email a@b.c.", ["id", "email"]),
    ("weekday", "Reply with only a JSON object with key \"day\" set to Monday.", ["day"]),
    ("sum", "Reply with only a JSON object with key \"sum\" holding 2 + 2.", ["sum"]),
    ("lang", "Reply with only a JSON object with keys \"language\" and \"code\" for French, fr.", ["language", "code"]),
    ("array", "Reply with only a JSON array of the numbers 1, 2 and 3.", []),
    ("empty", "Reply with only an empty JSON object.", []),
]
for pid, q, keys in JSON:
    add(f"json-{pid}", q, {"json": {"keys": keys}})

# Code: arithmetic expressions must parse and evaluate to the value; RON values must parse.
EXPR = [
    ("seconds-3h", "the number of seconds in 3 hours", 3 * 3600),
    ("minutes-day", "the number of minutes in a day", 24 * 60),
    ("hours-week", "the number of hours in a week", 7 * 24),
    ("area-rect", "the area of a 7 by 9 rectangle", 63),
    ("perimeter-sq", "the perimeter of a square with side 6", 24),
    ("avg", "the average of 4, 8 and 12", 8),
    ("square-12", "12 squared", 144),
    ("cube-3", "3 cubed", 27),
    ("half-90", "half of 90", 45),
    ("dozen-eggs", "the number of eggs in 5 dozen", 60),
    ("remainder", "the remainder of 17 divided by 5", 2),
]
for pid, what, value in EXPR:
    add(f"code-expr-{pid}", f"Write a single Python arithmetic expression, no text, that computes {what}.",
        {"code": {"lang": "expr", "value": value}})
RON = [
    ("tuple", "Write only a RON tuple with the numbers 1, 2 and 3."),
    ("struct", "Write only a RON struct with fields name: \"Ann\" and age: 3."),
    ("list", "Write only a RON list of three strings: \"a\", \"b\", \"c\"."),
    ("map", "Write only a RON map from \"x\" to 1."),
    ("option", "Write only the RON value Some(5)."),
]
for pid, q in RON:
    add(f"code-ron-{pid}", q, {"code": {"lang": "ron"}})

# Language: the answer must be in the prompt's language (a full sentence, so stop words show).
LANG = [
    ("fr", "sky", "Réponds en une phrase complète : pourquoi le ciel est-il bleu ?", None),
    ("fr", "capital-es", "Réponds en une phrase complète : quelle est la capitale de l'Espagne ?", ["Madrid"]),
    ("fr", "cat", "Décris un chat en une phrase.", None),
    ("fr", "winter", "Qu'est-ce que l'hiver ? Réponds en une phrase.", None),
    ("fr", "bread", "Comment fait-on du pain ? Réponds en une phrase.", None),
    ("de", "sky", "Antworte in einem ganzen Satz: Warum ist der Himmel blau?", None),
    ("de", "capital-fr", "Antworte in einem ganzen Satz: Was ist die Hauptstadt von Frankreich?", ["Paris"]),
    ("de", "dog", "Beschreibe einen Hund in einem Satz.", None),
    ("de", "rain", "Was ist Regen? Antworte in einem Satz.", None),
    ("de", "school", "Warum gehen Kinder zur Schule? Antworte in einem Satz.", None),
    ("es", "sky", "Responde con una frase completa: ¿por qué el cielo es azul?", None),
    ("es", "capital-it", "Responde con una frase completa: ¿cuál es la capital de Italia?", ["Roma"]),
    ("es", "sun", "Describe el sol en una frase.", None),
    ("es", "sea", "¿Qué es el mar? Responde en una frase.", None),
    ("es", "book", "¿Para qué sirve un libro? Responde en una frase.", None),
    ("it", "sky", "Rispondi con una frase completa: perché il cielo è blu?", None),
    ("it", "capital-de", "Rispondi con una frase completa: qual è la capitale della Germania?", ["Berlino", "Berlin"]),
    ("it", "pizza", "Descrivi la pizza in una frase.", None),
    ("it", "snow", "Che cos'è la neve? Rispondi in una frase.", None),
    ("it", "music", "Perché ascoltiamo la musica? Rispondi in una frase.", None),
    ("en", "sky", "In one full sentence: why is the sky blue?", None),
    ("en", "bread", "In one full sentence: how is bread made?", None),
]
for lang, pid, q, answers in LANG:
    check = {"language": lang}
    if answers:
        check = {"all": [{"contains_any": answers}, check]}
    add(f"lang-{lang}-{pid}", q, check)

about = (
    "The eval gate's general probes (the `general` leg): short prompts whose greedy answers are checked "
    "without a model. Written for hearth by scripts/general_probes.py (arithmetic and unit conversions drawn "
    "by a seeded generator, so answers are exact); frozen per base on first use "
    "(DATA_DIR/eval/<base sha256>.general.json)."
)
print(json.dumps({"about": about, "probes": probes}, ensure_ascii=False, indent=1))
