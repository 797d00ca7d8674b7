"""Training prompts for self-distillation: deterministic, seeded, varied.

`training_prompts(seed)` returns a list of prompt records

    {"prompt_id": "qa-00017", "category": "qa", "messages": [{"role": "user", "content": "..."}, ...]}

whose last message is always a user turn. The categories cover the Spec-Bench task kinds
(multi-turn `conversation`, `translation`, `summarization`, `qa`, `math_reasoning`, `rag`)
plus `coding`, `writing`, `roleplay`, `stem`, `humanities`, `extraction` and `reasoning`.

Where the text comes from (DESIGN.md section 8): templates combined with filler banks
written for this project, word problems with random numbers, small synthetic documents
(news items, biographies, town guides) whose facts are known so that RAG and extraction
questions can ask about them, and passages cut from the docstrings of the Python standard
library (plus the Zen of Python from the `this` module). Passages are trimmed to 80-250
words so every prompt stays well under ~600 tokens.

Determinism: every category draws from its own `random.Random(f"{seed}-{category}")`;
string seeds are hashed with SHA-512 by `random`, so results do not depend on
PYTHONHASHSEED. Docstrings are read from a fixed module list in sorted order, so the
prompts are stable for a given Python version.

`assert_disjoint(train, eval_path)` checks that no evaluation turn appears in, or shares a
12-word shingle with, any training prompt. `python -m core.training.prompts --stats`
prints counts per category and a few samples.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import inspect
import io
import json
import random
import re
import statistics
import textwrap
import warnings
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path

# How many prompts each category gets (3,520 in all).
CATEGORY_COUNTS: dict[str, int] = {
    "conversation": 400,
    "translation": 340,
    "summarization": 330,
    "qa": 380,
    "math_reasoning": 380,
    "rag": 330,
    "coding": 380,
    "writing": 200,
    "roleplay": 140,
    "stem": 200,
    "humanities": 160,
    "extraction": 160,
    "reasoning": 120,
}
SPEC_BENCH_KINDS = ("conversation", "translation", "summarization", "qa", "math_reasoning", "rag")
MAX_PROMPT_WORDS = 420  # rough guards for the ~600-token budget (English runs ~4 characters a token)
MAX_PROMPT_CHARS = 2300
SHINGLE = 12

Messages = list[dict]

# ------------------------------------------------------------------------------------------
# Filler banks
# ------------------------------------------------------------------------------------------

FIRST_NAMES = [
    "Amara", "Ben", "Chloe", "Daniel", "Elena", "Farid", "Grace", "Hiro", "Isla", "Jonas", "Kavya", "Liam",
    "Mei", "Nadia", "Omar", "Priya", "Quinn", "Rosa", "Samuel", "Tara", "Umar", "Valeria", "Wen", "Xavier",
    "Yara", "Zoe", "Aiden", "Bianca", "Carlos", "Dana", "Emeka", "Fatima", "Gustav", "Hana", "Ivan", "Julia",
    "Kofi", "Lena", "Mateo", "Noor", "Oscar", "Paula", "Rahul", "Sofia", "Tomas", "Uma", "Victor", "Wanda",
    "Yusuf", "Zainab", "Aaron", "Beatriz", "Connor", "Delia", "Erik", "Freya", "Gabriel", "Helen", "Ines",
    "Jamal", "Kira", "Lucas", "Maya", "Nikolai", "Olivia", "Pedro", "Ruth", "Stefan", "Tessa", "Yuki",
]
SURNAMES = [
    "Adeyemi", "Bauer", "Castillo", "Dubois", "Eriksen", "Fischer", "Garcia", "Hughes", "Ibrahim", "Jensen",
    "Kowalski", "Larsen", "Moreau", "Nakamura", "Okafor", "Petrov", "Quispe", "Rossi", "Schmidt", "Tanaka",
    "Usman", "Varga", "Weber", "Xu", "Yilmaz", "Zhang", "Alvarez", "Brennan", "Costa", "Delgado", "Evans",
    "Ferreira", "Gallagher", "Haddad", "Iyer", "Jovanovic", "Kim", "Lindqvist", "Mensah", "Novak", "Ortiz",
    "Park", "Reyes", "Silva", "Torres", "Uchida", "Vance", "Walsh", "Yamada", "Ziegler",
]
CITIES = [
    "Lisbon", "Kyoto", "Nairobi", "Montreal", "Krakow", "Lima", "Hanoi", "Edinburgh", "Seville", "Melbourne",
    "Istanbul", "Copenhagen", "Marrakesh", "Vancouver", "Prague", "Buenos Aires", "Singapore", "Vienna",
    "Cape Town", "Oslo", "Budapest", "Mexico City", "Seoul", "Dublin", "Athens", "Tbilisi", "Porto", "Quebec City",
    "Valencia", "Ljubljana", "Reykjavik", "Bogota", "Tallinn", "Hoi An", "Cusco", "Zanzibar", "Bruges", "Naples",
]
COUNTRIES = [
    "France", "Japan", "Kenya", "Brazil", "Canada", "India", "Norway", "Egypt", "Argentina", "Vietnam", "Poland",
    "Australia", "Mexico", "Turkey", "Portugal", "Indonesia", "Peru", "Morocco", "Finland", "South Korea",
    "Ghana", "Chile", "Greece", "Ireland", "New Zealand", "Thailand", "Hungary", "Colombia", "Iceland",
    "Nigeria", "Spain", "Sweden", "Italy", "Germany", "the Philippines", "Ethiopia", "Switzerland", "Malaysia",
]
LANGUAGES = [
    "French", "Spanish", "German", "Italian", "Portuguese", "Dutch", "Swedish", "Polish", "Turkish", "Japanese",
    "Chinese", "Korean", "Russian", "Arabic", "Hindi", "Indonesian", "Greek", "Czech",
]

# (concept, short description) pairs used by stem, qa and conversation prompts.
CONCEPTS = [
    ("photosynthesis", "the process plants use to turn light, water and carbon dioxide into sugar and oxygen"),
    ("the water cycle", "the continuous movement of water through evaporation, condensation and precipitation"),
    ("plate tectonics", "the theory that Earth's outer shell is split into moving plates"),
    ("natural selection", "the process by which organisms with useful traits survive and reproduce more often"),
    ("entropy", "a measure of how many microscopic arrangements are consistent with a system's state"),
    ("compound interest", "interest earned both on the original amount and on interest already added"),
    ("inflation", "a general rise in prices that reduces what a unit of money can buy"),
    ("supply and demand", "the model in which prices settle where the quantity offered meets the quantity wanted"),
    ("black holes", "regions of space where gravity is so strong that not even light can escape"),
    ("the greenhouse effect", "the warming of a planet's surface by gases that trap outgoing heat"),
    ("vaccination", "training the immune system with a harmless version or part of a germ"),
    ("DNA replication", "the copying of a cell's DNA before it divides"),
    ("machine learning", "building programs that improve at a task by learning patterns from data"),
    ("public-key cryptography", "encryption that uses a public key to lock and a private key to unlock"),
    ("the Pythagorean theorem", "the rule that in a right triangle a squared plus b squared equals c squared"),
    ("prime numbers", "whole numbers greater than one whose only divisors are one and themselves"),
    ("probability", "a number between zero and one that measures how likely an event is"),
    ("electric circuits", "closed loops through which electric current flows from a source and back"),
    ("magnetism", "the force produced by moving charges and by certain materials such as iron"),
    ("the immune system", "the network of cells and organs that defends the body against infection"),
    ("climate change", "the long-term shift in global temperatures and weather patterns"),
    ("renewable energy", "energy from sources that refill naturally, such as sunlight and wind"),
    ("the speed of light", "the fixed speed, about 300,000 km per second, at which light travels in a vacuum"),
    ("gravity", "the attraction between masses that keeps planets in orbit"),
    ("osmosis", "the movement of water across a membrane toward the side with more dissolved substance"),
    ("the periodic table", "the chart that arranges chemical elements by atomic number and properties"),
    ("chemical bonds", "the forces that hold atoms together in molecules and crystals"),
    ("sound waves", "vibrations that travel through a medium such as air or water"),
    ("the scientific method", "a cycle of observing, forming hypotheses, testing them and revising ideas"),
    ("recursion", "solving a problem by having a function call itself on smaller inputs"),
    ("binary numbers", "numbers written in base two using only the digits zero and one"),
    ("the internet", "a global network of computers that exchange data using shared protocols"),
    ("neural networks", "models made of layers of simple units whose connection weights are learned"),
    ("blockchain", "a shared ledger in which each block of records is linked to the previous one by a hash"),
    ("volcanoes", "openings in Earth's crust where molten rock, ash and gas escape"),
    ("earthquakes", "sudden shaking of the ground caused by movement along faults"),
    ("ocean currents", "continuous, directed movements of seawater driven by wind, heat and salinity"),
    ("the carbon cycle", "the exchange of carbon between the air, oceans, rocks and living things"),
    ("antibiotics", "medicines that kill bacteria or stop them from growing"),
    ("the human heart", "the muscular organ that pumps blood through the body"),
    ("sleep", "a recurring state of rest in which the brain consolidates memories"),
    ("photosynthetic algae", "tiny aquatic organisms that produce much of the world's oxygen"),
    ("semiconductors", "materials whose electrical conductivity lies between that of conductors and insulators"),
    ("the stock market", "a marketplace where shares of companies are bought and sold"),
    ("opportunity cost", "the value of the best alternative you give up when making a choice"),
    ("algorithms", "step-by-step procedures for solving a problem or performing a computation"),
    ("sorting algorithms", "methods for arranging items in order, such as merge sort and quicksort"),
    ("databases", "organised collections of data that can be queried and updated efficiently"),
    ("operating systems", "software that manages a computer's hardware and runs other programs"),
    ("cloud computing", "renting computing power and storage over the internet instead of owning it"),
    ("tides", "the regular rise and fall of sea levels caused mainly by the Moon's gravity"),
    ("the seasons", "yearly changes in weather caused by the tilt of Earth's axis"),
    ("the Doppler effect", "the change in frequency of a wave when its source moves relative to the listener"),
    ("friction", "the force that resists the sliding of one surface over another"),
    ("kinetic energy", "the energy an object has because of its motion"),
    ("acids and bases", "substances that donate or accept hydrogen ions in solution"),
    ("cell division", "the process by which one cell splits into two"),
    ("ecosystems", "communities of living things interacting with each other and their environment"),
    ("biodiversity", "the variety of life in a particular habitat or on Earth as a whole"),
    ("nuclear fusion", "the joining of light atomic nuclei into heavier ones, releasing energy"),
    ("statistics", "the science of collecting, summarising and drawing conclusions from data"),
    ("the placebo effect", "an improvement in symptoms caused by the expectation of treatment"),
    ("exponential growth", "growth in which a quantity increases by a fixed percentage in each period"),
    ("encryption", "scrambling information so that only someone with the key can read it"),
    ("version control", "tracking and managing changes to files over time"),
]
OTHER_CONCEPT = {
    "photosynthesis": "cellular respiration", "inflation": "deflation", "machine learning": "traditional programming",
    "weather": "climate", "mitosis": "meiosis", "viruses": "bacteria", "recursion": "iteration",
    "encryption": "hashing", "gravity": "magnetism", "volcanoes": "earthquakes", "the stock market": "bonds",
}
QA_PAIRS = [
    ("weather", "climate"), ("a virus", "a bacterium"), ("mitosis", "meiosis"), ("speed", "velocity"),
    ("mass", "weight"), ("an alligator", "a crocodile"), ("a meteor", "a meteorite"), ("a latte", "a cappuccino"),
    ("RAM", "storage"), ("a democracy", "a republic"), ("baking soda", "baking powder"), ("a lake", "a pond"),
    ("a hurricane", "a typhoon"), ("a simile", "a metaphor"), ("an atom", "a molecule"), ("AC", "DC current"),
    ("a stock", "a bond"), ("a frog", "a toad"), ("an ape", "a monkey"), ("a comet", "an asteroid"),
    ("HTTP", "HTTPS"), ("a compiler", "an interpreter"), ("a debit card", "a credit card"),
    ("a psychologist", "a psychiatrist"), ("fog", "mist"), ("a violin", "a viola"), ("a rabbit", "a hare"),
    ("an epidemic", "a pandemic"), ("a tortoise", "a turtle"), ("a list", "a tuple in Python"),
    ("nuclear fission", "nuclear fusion"), ("a star", "a planet"), ("an app", "a website"),
    ("socialism", "communism"), ("an essay", "a report"), ("a sprain", "a strain"), ("jam", "jelly"),
]
PEOPLE = [
    "Marie Curie", "Isaac Newton", "Ada Lovelace", "Leonardo da Vinci", "Nelson Mandela", "Frida Kahlo",
    "Albert Einstein", "Rosalind Franklin", "Mahatma Gandhi", "Alan Turing", "Wangari Maathai", "Galileo Galilei",
    "Charles Darwin", "Jane Austen", "Nikola Tesla", "Hypatia", "Ibn Battuta", "Confucius", "Simon Bolivar",
    "Harriet Tubman", "Johann Sebastian Bach", "Katherine Johnson", "Louis Pasteur", "Murasaki Shikibu",
    "Florence Nightingale", "Gregor Mendel", "Srinivasa Ramanujan", "Amelia Earhart", "Dmitri Mendeleev",
    "Grace Hopper", "Rumi", "Mansa Musa", "Tim Berners-Lee", "Emmy Noether", "Ludwig van Beethoven",
]
EVENTS = [
    "the fall of the Berlin Wall", "the first Moon landing", "the French Revolution",
    "the invention of the printing press",
    "the Industrial Revolution", "the signing of the Magna Carta", "the building of the Great Wall of China",
    "the Renaissance", "the end of World War II", "the construction of the Panama Canal", "the Black Death",
    "the founding of the United Nations", "the discovery of penicillin", "the collapse of the Roman Empire",
    "the Meiji Restoration", "the partition of India", "the first powered flight", "the abolition of the slave trade",
    "the Cuban Missile Crisis", "the launch of Sputnik", "the independence of Ghana", "the Reformation",
    "the opening of the Suez Canal", "the Apollo 13 mission", "the invention of the telephone",
]
LANDMARKS = [
    "Machu Picchu", "the Taj Mahal", "Angkor Wat", "the Great Barrier Reef", "the Colosseum", "Petra",
    "Mount Kilimanjaro", "the Acropolis", "Chichen Itza", "Victoria Falls", "the Sagrada Familia", "Uluru",
    "the Alhambra", "Stonehenge", "the Forbidden City", "Table Mountain", "the Hagia Sophia", "Easter Island",
]
HOWTO_TASKS = [
    "remove a coffee stain from a white shirt", "change a flat bicycle tire", "start a vegetable garden on a balcony",
    "write a good resume", "improve my sleep", "make sourdough bread", "learn to touch type", "save money on groceries",
    "prepare for a job interview", "train for a 5 km run", "keep houseplants alive", "organize a small closet",
    "speak more confidently in meetings", "back up the photos on my phone", "clean a cast-iron pan",
    "brew pour-over coffee", "learn the basics of chess", "reduce screen time", "plan a weekly meal menu",
    "write a polite complaint email", "take better photos with a phone", "memorize a short speech",
    "choose a good laptop for studying", "set up a monthly budget", "get rid of fruit flies in the kitchen",
    "teach a dog to sit", "make a paper airplane that flies far", "descale an electric kettle",
    "repot a cactus safely", "negotiate a higher salary", "learn a new language as an adult",
]
WHY_QUESTIONS = [
    "Why is the sky blue?", "Why do leaves change color in autumn?", "Why does ice float on water?",
    "Why do we have leap years?", "Why do cats purr?", "Why is the ocean salty?", "Why do onions make you cry?",
    "Why do we yawn?", "Why does bread go stale?", "Why do stars twinkle?", "Why do birds migrate?",
    "Why is Mars red?", "Why do we get goosebumps?", "Why do metals feel cold to the touch?",
    "Why does the Moon have phases?", "Why do zebras have stripes?", "Why do airplanes leave white trails?",
    "Why does popcorn pop?", "Why do we dream?", "Why do bubbles look rainbow-colored?", "Why is glass transparent?",
    "Why do our ears pop on an airplane?", "Why does hot water sometimes freeze faster than cold water?",
    "Why do some people need glasses?", "Why do bees make honey?", "Why is snow white?",
]
TRIVIA = [
    "Which planet is the largest in our solar system?", "What is the longest river in Africa?",
    "How many bones are in the adult human body?", "What gas do plants absorb from the air?",
    "Which element has the chemical symbol Fe?", "Who painted the Mona Lisa?", "What is the smallest prime number?",
    "How many continents are there?", "What is the hardest natural substance?", "Which ocean is the deepest?",
    "What is the freezing point of water in Fahrenheit?", "Who wrote Pride and Prejudice?",
    "What is the tallest mountain on Earth?", "How many sides does a hexagon have?",
    "What language has the most native speakers?",
    "What is the main ingredient in guacamole?", "Which animal is known as the ship of the desert?",
    "Who developed the theory of general relativity?", "What is the largest desert in the world?",
    "Which organ produces insulin?", "How long does light from the Sun take to reach Earth?",
    "What is the chemical formula of table salt?", "Which country gifted the Statue of Liberty to the United States?",
    "What is the currency of Japan?", "How many strings does a standard guitar have?",
]
ABBREVIATIONS = [
    "NASA", "UNESCO", "DNA", "GDP", "CPU", "HTML", "WHO", "laser", "scuba", "radar", "PDF", "USB", "NATO",
    "ATM", "GPS", "SQL", "API", "LED", "RSVP", "ETA", "FAQ", "IQ", "PhD", "CEO", "UV",
]
INVENTIONS = ["the telephone", "the light bulb", "paper", "the bicycle", "the compass", "the World Wide Web",
              "the steam engine", "the radio", "the microscope", "the printing press", "the airplane",
              "the thermometer"]
UNIT_PAIRS = [
    ("seconds", "day"), ("grams", "kilogram"), ("centimeters", "meter"), ("minutes", "week"), ("inches", "foot"),
    ("ounces", "pound"), ("milliliters", "liter"), ("feet", "mile"), ("days", "leap year"), ("hours", "year"),
]
TOPICS = [
    "autumn in the mountains", "a rainy city night", "the first day at a new school", "a lost umbrella",
    "friendship", "the ocean at dawn", "a robot learning to paint", "an old lighthouse", "a busy train station",
    "the smell of fresh bread", "moving to a new country", "a garden in winter", "a grandmother's recipe",
    "the last bookstore in town", "a cat who thinks it is a dog", "learning to ride a bike", "a power outage",
    "a village festival", "space exploration", "a forgotten letter", "the joy of cooking", "a snow day",
    "recycling", "a long road trip", "kindness to strangers", "city gardens", "the history of tea",
    "a marathon", "a street musician", "a desert at night", "remote work", "an abandoned amusement park",
    "the importance of sleep", "electric cars", "a small coffee shop", "birdwatching", "a summer thunderstorm",
    "a time traveler's mistake", "the first snowfall", "a community library", "ocean plastic", "public transport",
    "a family reunion", "a night market", "learning from failure", "a mountain hut", "a dragon who is afraid of fire",
    "a hidden waterfall", "volunteering", "the life of a honeybee", "an unexpected friendship", "a chess tournament",
]
AUDIENCES = [
    "a ten-year-old", "a high-school student", "a busy executive", "a complete beginner", "a university student",
    "my grandmother", "a software engineer", "a curious teenager", "a group of tourists", "a new employee",
]
TONES = ["formal", "friendly", "humorous", "enthusiastic", "calm", "persuasive", "poetic", "concise", "warm", "serious"]

# Goals with tips, for advice conversations and list rewriting.
GOALS = {
    "get fit": ["walk for thirty minutes a day", "add two strength sessions a week", "sleep at least seven hours",
                "track what you eat for a week"],
    "learn to cook": ["master five simple recipes", "keep your knives sharp", "taste as you go",
                      "prepare ingredients before you start"],
    "save money": ["write down every expense for a month", "set up an automatic transfer to savings",
                   "cancel unused subscriptions", "plan meals before shopping"],
    "read more books": ["carry a book everywhere", "read for twenty minutes before bed", "join a book club",
                        "give up on books you don't enjoy"],
    "learn to program": ["pick one language and stick with it", "build small projects", "read other people's code",
                         "practice a little every day"],
    "be more productive": ["plan tomorrow's three main tasks tonight", "turn off notifications while working",
                           "work in focused blocks", "batch small chores together"],
    "reduce stress": ["take short walks outside", "practice slow breathing", "limit caffeine after noon",
                      "talk to someone you trust"],
    "learn Spanish": ["use a flashcard app daily", "watch shows with Spanish subtitles", "find a conversation partner",
                      "learn the hundred most common verbs"],
    "start running": ["begin with run-walk intervals", "buy comfortable shoes", "increase distance slowly",
                      "rest at least one day between runs"],
    "keep a clean home": ["tidy for ten minutes every evening", "put things back right away", "clean the kitchen daily",
                          "declutter one drawer a week"],
    "make new friends in a new city": ["join a local club", "say yes to invitations", "take a class",
                                       "volunteer for a cause you care about"],
    "eat healthier": ["fill half your plate with vegetables", "drink water instead of soda", "cook at home more often",
                      "keep fruit on the counter"],
    "grow tomatoes": ["choose a sunny spot", "water deeply but not too often", "stake the plants early",
                      "pinch off suckers"],
    "write a novel": ["write a little every day", "outline the main plot points", "finish a draft before editing",
                      "read widely in your genre"],
    "prepare for exams": ["start reviewing two weeks early", "test yourself instead of rereading", "sleep well",
                          "study in short sessions"],
    "take better photographs": ["learn the rule of thirds", "shoot in soft morning light", "get closer to your subject",
                                "take many shots and pick the best"],
}
SITUATIONS = [
    "I only have about {n} minutes a day", "I'm on a tight budget", "I tried before and gave up after {n} weeks",
    "I work night shifts", "I have two small kids at home", "I'm a complete beginner", "I live in a tiny apartment",
    "I travel a lot for work", "I get bored easily", "I'm {age} years old",
]
FOLLOW_UPS = [
    "Can you give me a real-world example?", "Explain that like I'm ten years old.", "Why does that matter?",
    "What are some common misconceptions about it?", "Can you summarize that in one sentence?",
    "What would be a good first book or resource to learn more?", "How was this discovered?",
    "Can you explain it with an analogy?", "What are the limitations of that explanation?",
    "How is this used in everyday life?", "Could you make a short quiz with three questions about it?",
    "What is the most surprising fact about it?", "Can you go into more technical detail?",
    "Is there a simple experiment I could do at home to see this?", "Who were the key people behind this idea?",
]
LIST_FOLLOW_UPS = [
    "Now expand point {k} into a full paragraph.", "Turn that list into a short motivational poem.",
    "Rank those from most to least important and explain your ranking.", "Rewrite the list for a teenager.",
    "Which of these would you start with, and why?", "Can you add two more items to the list?",
    "Make a one-week plan based on that list.", "Rewrite that list as a short email to a friend.",
    "What obstacles might come up with point {k}, and how can I handle them?",
]

# Translation material ---------------------------------------------------------------------
EN_SUBJECTS = [
    "My neighbor", "The teacher", "Our youngest daughter", "The old fisherman", "A tourist from Canada",
    "The new manager", "My grandfather", "The baker on the corner", "Every student in the class", "The doctor",
    "The taxi driver", "Her brother", "The orchestra", "A small group of volunteers", "The mayor",
]
EN_VERBS = [
    "found", "repaired", "painted", "sold", "bought", "forgot", "carried", "lost", "delivered", "cleaned",
    "borrowed", "returned", "opened", "described", "photographed",
]
EN_OBJECTS = [
    "the blue bicycle", "an old map of the city", "a basket of apples", "the broken window", "a letter from Spain",
    "the kitchen table", "a box of books", "the front door key", "a bunch of sunflowers", "the wooden boat",
    "a heavy suitcase", "the school bus", "a pair of hiking boots", "the garden fence", "a cake for the party",
]
EN_PLACES = [
    "near the river", "in the town square", "at the train station", "behind the library", "on the top floor",
    "in the garden", "at the market", "next to the bakery", "in the old harbor", "outside the museum",
]
EN_TIMES = [
    "yesterday morning", "last weekend", "after lunch", "before sunrise", "on Tuesday", "during the storm",
    "late at night", "two days ago", "this afternoon", "at the end of the summer",
]
EN_PHRASES = [
    "Could you tell me where the nearest {place_noun} is?",
    "I would like to book a {room} for {n} nights, starting on {weekday}.",
    "The meeting has been moved to {weekday} at {hour} o'clock.",
    "My {relative} is visiting {city} next {period}.",
    "We need to finish the report before {weekday} afternoon.",
    "How much does a train ticket to {city} cost?",
    "Please remember to {chore} before you leave the house.",
    "I have been learning {language} for {n} months, but I still find the grammar difficult.",
    "The museum is closed on {weekday}s, so let's go on {weekday2} instead.",
    "Do you know a good restaurant that serves {food}?",
    "It has been raining in {city} for {n} days without a break.",
    "If you have any questions about the contract, please call me before {hour} o'clock.",
    "The children planted {n} trees in the park to celebrate the end of the school year.",
    "Our flight to {city} was delayed by {n} hours because of the fog.",
    "I'm sorry, I didn't understand. Could you speak a little more slowly?",
]
PLACE_NOUNS = ["pharmacy", "bus stop", "post office", "bank", "hospital", "supermarket", "train station", "library"]
ROOMS = ["double room", "single room", "room with a sea view", "quiet room", "family room"]
RELATIVES = ["sister", "uncle", "cousin", "mother", "best friend", "grandmother", "brother-in-law"]
PERIODS = ["week", "month", "spring", "summer", "winter"]
CHORES = ["water the plants", "lock the back door", "turn off the oven", "feed the cat", "close the windows"]
FOODS = ["fresh seafood", "vegetarian dishes", "homemade pasta", "spicy noodles", "traditional stew", "good pizza"]
WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]

DE_SUBJECTS = ["Der Lehrer", "Die Ärztin", "Das Kind", "Mein Bruder", "Unsere Nachbarin", "Der alte Mann",
               "Die Studentin", "Der Bäcker", "Meine Großmutter", "Der Busfahrer", "Die Polizistin", "Unser Sohn"]
DE_VERBS = ["liest", "kauft", "sucht", "repariert", "verkauft", "findet", "braucht", "öffnet", "schreibt", "malt",
            "putzt", "bestellt"]
DE_OBJECTS = ["einen langen Brief", "das alte Fahrrad", "die Zeitung", "ein neues Auto", "den Schlüssel",
              "eine Tasse Kaffee", "das Fenster", "einen Kuchen", "die Rechnung", "ein Geschenk für seine Mutter",
              "den Tisch in der Küche", "eine Karte der Stadt"]
DE_ADVERBIALS = ["am Morgen", "im Garten", "jeden Tag", "nach der Arbeit", "in der Stadt", "mit großer Sorgfalt",
                 "heute Abend", "am Wochenende", "vor dem Frühstück", "im Büro"]
DE_ACTORS = ["Die Regierung", "Der Bürgermeister", "Das Unternehmen", "Die Polizei", "Der Verband",
             "Die Stadtverwaltung", "Der Vorstand", "Die Gewerkschaft", "Das Ministerium", "Die Universität"]
DE_TIMES = ["am Montag", "am Dienstag", "in der vergangenen Woche", "am Mittwochabend", "Anfang des Monats",
            "am Freitag", "gestern", "nach langen Verhandlungen", "überraschend", "am Wochenende"]
DE_NEWS_OBJECTS = [
    "neue Maßnahmen zum Klimaschutz", "einen Plan für den Ausbau der Schulen", "die Erhöhung der Preise",
    "eine neue Strategie für den Nahverkehr", "mehr Geld für Krankenhäuser", "den Bau einer neuen Brücke",
    "strengere Regeln für den Datenschutz", "die Schließung des alten Werks", "ein Programm für junge Familien",
    "die Ergebnisse der Untersuchung", "einen Kompromiss mit den Gewerkschaften", "neue Radwege in der Innenstadt",
]
DE_PARTICIPLES = ["angekündigt", "vorgestellt", "kritisiert", "beschlossen", "verteidigt", "abgelehnt", "begrüßt"]
DE_EXTRA = [
    "Die Entscheidung soll bis zum Ende des Jahres umgesetzt werden.",
    "Kritiker halten die Pläne für zu teuer.",
    "Viele Bürger reagierten erleichtert auf die Nachricht.",
    "Eine Sprecherin wollte sich zu den Details nicht äußern.",
    "Die Opposition fordert eine schnelle Abstimmung im Parlament.",
    "Nach Angaben der Behörden sind rund {n} Menschen betroffen.",
    "Die Kosten werden auf etwa {n} Millionen Euro geschätzt.",
    "Experten rechnen mit weiteren Verzögerungen.",
]
FR_SUBJECTS = ["Mon frère", "La voisine", "Le professeur", "Ma grand-mère", "L'enfant", "Notre équipe",
               "Le boulanger", "Ma collègue", "Le chauffeur", "Cette étudiante"]
FR_VERBS = ["prépare", "achète", "cherche", "lit", "répare", "vend", "regarde", "ouvre", "range", "apporte"]
FR_OBJECTS = ["un gâteau au chocolat", "la voiture", "le journal", "une lettre", "les clés", "un nouveau vélo",
              "la fenêtre", "un bouquet de fleurs", "le dossier", "une carte de la région"]
FR_ADVERBIALS = ["dans le jardin", "ce matin", "tous les jours", "après le travail", "au marché", "avant le dîner",
                 "pendant les vacances", "à la gare", "chaque samedi"]
ES_SUBJECTS = ["Mi hermano", "La vecina", "El profesor", "Mi abuela", "El niño", "Nuestro equipo", "El panadero",
               "Mi compañera", "El conductor", "Esta estudiante"]
ES_VERBS = ["prepara", "compra", "busca", "lee", "repara", "vende", "mira", "abre", "limpia", "trae"]
ES_OBJECTS = ["un pastel", "el coche", "el periódico", "una carta", "las llaves", "una bicicleta nueva",
              "la ventana", "un ramo de flores", "el informe", "un mapa de la ciudad"]
ES_ADVERBIALS = ["en el jardín", "esta mañana", "todos los días", "después del trabajo", "en el mercado",
                 "antes de la cena", "durante las vacaciones", "en la estación", "cada sábado"]

# Coding material --------------------------------------------------------------------------
FUNCTION_SPECS = [
    ("reverse_words", "reverses the order of the words in a sentence"),
    ("is_prime", "checks whether an integer is a prime number"),
    ("fibonacci", "returns the n-th Fibonacci number"),
    ("merge_sorted", "merges two sorted lists into one sorted list"),
    ("count_vowels", "counts the vowels in a string"),
    ("is_palindrome", "checks whether a string reads the same backwards, ignoring case and spaces"),
    ("flatten", "flattens an arbitrarily nested list"),
    ("word_frequencies", "returns a dictionary mapping each word in a text to how often it occurs"),
    ("gcd", "computes the greatest common divisor of two integers"),
    ("binary_search", "finds the index of a target value in a sorted list, or returns -1"),
    ("chunk", "splits a list into chunks of a given size"),
    ("celsius_to_fahrenheit", "converts a temperature from Celsius to Fahrenheit"),
    ("remove_duplicates", "removes duplicates from a list while keeping the original order"),
    ("second_largest", "returns the second largest distinct number in a list"),
    ("rotate_list", "rotates a list to the right by k positions"),
    ("is_anagram", "checks whether two strings are anagrams of each other"),
    ("factorial", "computes the factorial of a non-negative integer"),
    ("matrix_transpose", "transposes a matrix given as a list of lists"),
    ("run_length_encode", "compresses a string with run-length encoding, for example 'aaab' to 'a3b1'"),
    ("validate_email", "checks whether a string looks like a valid email address"),
    ("roman_to_int", "converts a Roman numeral to an integer"),
    ("int_to_roman", "converts an integer between 1 and 3999 to a Roman numeral"),
    ("longest_common_prefix", "finds the longest common prefix of a list of strings"),
    ("moving_average", "computes the moving average of a list of numbers over a window of size k"),
    ("balanced_brackets", "checks whether the brackets (), [] and {} in a string are balanced"),
    ("caesar_cipher", "encrypts a text with a Caesar cipher using a given shift"),
    ("sum_of_digits", "returns the sum of the digits of an integer"),
    ("find_missing_number", "finds the missing number in a list containing 1 to n with one number missing"),
    ("capitalize_words", "capitalizes the first letter of every word in a sentence"),
    ("count_islands", "counts the islands of 1s in a grid of 0s and 1s"),
    ("two_sum", "returns the indices of two numbers in a list that add up to a target"),
    ("median", "computes the median of a list of numbers"),
    ("is_leap_year", "checks whether a year is a leap year"),
    ("group_by_length", "groups a list of words into a dictionary keyed by word length"),
    ("parse_csv_line", "splits a CSV line into fields, handling quoted fields that contain commas"),
    ("dict_invert", "inverts a dictionary, mapping each value to the list of keys that had it"),
    ("snake_to_camel", "converts a snake_case identifier to camelCase"),
    ("primes_up_to", "returns all prime numbers up to n using the sieve of Eratosthenes"),
    ("power_set", "returns all subsets of a set"),
    ("permutations", "returns all permutations of a list"),
    ("deep_merge", "recursively merges two nested dictionaries"),
    ("top_k_frequent", "returns the k most frequent elements of a list"),
    ("max_subarray_sum", "returns the maximum sum of a contiguous subarray"),
    ("lru_cache_class", "implements a least-recently-used cache class with get and put methods"),
    ("stack_class", "implements a stack class with push, pop, peek and is_empty methods"),
    ("queue_with_two_stacks", "implements a queue using two stacks"),
    ("linked_list_reverse", "reverses a singly linked list"),
    ("tree_depth", "computes the maximum depth of a binary tree"),
    ("bfs_shortest_path", "finds the shortest path between two nodes in an unweighted graph with breadth-first search"),
    ("dijkstra", "computes shortest path distances from a source node with Dijkstra's algorithm"),
    ("topological_sort", "returns a topological order of a directed acyclic graph"),
    ("levenshtein", "computes the edit distance between two strings"),
    ("format_duration", "formats a number of seconds as a human-readable string like '1h 02m 05s'"),
    ("parse_query_string", "parses a URL query string into a dictionary"),
    ("wrap_text", "wraps a paragraph of text to a maximum line width"),
    ("normalize_whitespace", "collapses runs of whitespace in a string into single spaces"),
    ("count_lines", "counts the non-empty lines in a text file"),
    ("read_json_config", "reads a JSON configuration file and fills in default values for missing keys"),
    ("retry", "retries a function call up to n times with exponential backoff"),
    ("timer_decorator", "is a decorator that prints how long a function takes to run"),
    ("bank_account_class", "implements a bank account class with deposit, withdraw and balance, refusing overdrafts"),
    ("tic_tac_toe_winner", "determines the winner of a tic-tac-toe board"),
    ("histogram", "prints a text histogram of a list of integers"),
    ("pascal_triangle", "returns the first n rows of Pascal's triangle"),
    ("spiral_order", "returns the elements of a matrix in spiral order"),
    ("valid_sudoku_row", "checks whether a row of a Sudoku grid is valid"),
    ("collatz_steps", "counts the steps for a number to reach 1 in the Collatz sequence"),
    ("digital_root", "computes the digital root of a positive integer"),
    ("interval_merge", "merges overlapping intervals in a list of (start, end) pairs"),
    ("bit_count", "counts the set bits in the binary representation of an integer"),
]
LANGS_CODE = ["Python"] * 6 + ["JavaScript", "JavaScript", "TypeScript", "Java", "C++", "C", "Go", "Rust", "C#",
                                "Ruby", "Kotlin"]
SQL_TASKS = [
    "returns the five customers who spent the most money in 2023",
    "counts the orders per month for the last year",
    "lists employees who earn more than the average salary of their department",
    "finds products that have never been ordered",
    "returns the second highest salary in the employees table",
    "deletes duplicate rows from a table of email addresses, keeping the lowest id",
    "computes the running total of sales per day",
    "lists the departments with more than ten employees",
    "finds customers who placed orders in two consecutive months",
    "returns each student's best exam score together with the exam date",
    "joins the orders and customers tables and shows the customer's city for each order",
    "finds the most popular product category in each country",
    "computes the percentage of orders that were returned",
    "lists all managers together with the number of people who report to them",
]
REGEX_TARGETS = [
    "a US ZIP code with an optional four-digit extension", "a date in the format YYYY-MM-DD", "an IPv4 address",
    "a hexadecimal color code like #1a2B3c", "a time in 24-hour format",
    "a word that starts and ends with the same letter",
    "a strong password with at least one digit, one uppercase letter and eight characters",
    "a Python variable name", "a URL that starts with http or https", "a phone number like (555) 123-4567",
]
SHELL_TASKS = [
    "find all files larger than 100 MB in my home directory", "count the lines in every .py file in a folder",
    "rename all .jpeg files to .jpg", "see which process is using port 8080", "compress a folder into a tar.gz archive",
    "search for a word in all text files recursively", "show the disk usage of each subfolder",
    "download a file and resume it if the connection drops", "list the ten most recently modified files",
    "replace a string in many files at once", "schedule a script to run every night at 2 am",
]
BUGGY_SNIPPETS = [
    ("def average(values):\n    total = 0\n    for v in values:\n        total += v\n    return total / "
     "len(values) - 1\n",
     "It should return the arithmetic mean."),
    ("def last_n(items, n):\n    return items[len(items) - n - 1:]\n", "It should return the last n items."),
    ("def count_words(text):\n    counts = {}\n    for word in text.split():\n        counts[word] = counts[word] + 1\n"
     "    return counts\n", "It should count how often each word occurs."),
    ("def is_even(n):\n    return n % 2 == 1\n", "It should return True for even numbers."),
    ("def append_item(item, items=[]):\n    items.append(item)\n    return items\n",
     "Each call without a list should start from an empty list."),
    ("def find_max(numbers):\n    best = 0\n    for n in numbers:\n        if n > best:\n            best = n\n"
     "    return best\n", "It should also work for lists of negative numbers."),
    ("def factorial(n):\n    result = 1\n    for i in range(1, n):\n        result *= i\n    return result\n",
     "factorial(5) should be 120."),
    ("def read_lines(path):\n    f = open(path)\n    lines = f.readlines()\n    return [l.strip() for l in lines]\n",
     "The file should always be closed."),
    ("def contains(sorted_list, x):\n    lo, hi = 0, len(sorted_list)\n    while lo < hi:\n        mid = (lo + "
     "hi) // 2\n"
     "        if sorted_list[mid] < x:\n            lo = mid\n        else:\n            hi = mid\n"
     "    return lo < len(sorted_list) and sorted_list[lo] == x\n", "It sometimes never finishes."),
    ("function sum(arr) {\n  let total;\n  for (let i = 0; i <= arr.length; i++) {\n    total += arr[i];\n  }\n"
     "  return total;\n}\n", "It should return the sum of the array."),
    ("def remove_negatives(nums):\n    for i, n in enumerate(nums):\n        if n < 0:\n            nums.pop(i)\n"
     "    return nums\n", "remove_negatives([-1, -2, 3]) should return [3]."),
    ("def percent(part, whole):\n    return part // whole * 100\n", "percent(1, 4) should be 25.0."),
]

# Writing / roleplay / humanities material -------------------------------------------------
WRITING_FORMS = [
    "a short poem", "a haiku", "a limerick", "a short story of about 200 words", "the opening paragraph of a novel",
    "a blog post introduction", "a product description", "a persuasive paragraph", "a diary entry", "a short speech",
    "a letter to a friend", "a thank-you note", "a news headline and lead paragraph", "a song chorus",
    "a motivational message", "a short fable with a moral", "a tweet-length announcement",
    "a dialogue between two friends",
    "a travel postcard", "a restaurant review", "a movie pitch", "an acrostic poem",
]
WRITING_CONSTRAINTS = [
    "", "", "", "Use a {tone} tone.", "Write it for {audience}.", "Keep it under 100 words.",
    "Do not use the letter 'e' more than necessary.", "Include a surprising twist.", "End with a question.",
    "Use at least three vivid sensory details.", "Make every sentence start with a different letter.",
    "Write it in the second person.", "Include the word '{word}'.",
]
WRITING_TASKS = [
    "Write a professional email to {name} asking to move our meeting from {weekday} to {weekday2}.",
    "Write a cover letter for a junior {job} position at a small company.",
    "Draft a short apology message to a customer whose order arrived {n} days late.",
    "Write an invitation to a {event_kind} on {weekday} evening.",
    "Write a LinkedIn post announcing that I started a new job as a {job}.",
    "Rewrite this sentence to sound more {tone}: \"{sentence}\"",
    "Write three catchy slogans for a {business} in {city}.",
    "Write a short toast for my {relative}'s {n}th birthday.",
    "Write a review of a fictional {gadget} that has one great feature and one annoying flaw.",
    "Write a bedtime story about {topic} for {audience}.",
]
JOBS = ["data analyst", "graphic designer", "nurse", "teacher", "software developer", "accountant", "chef",
        "marketing assistant", "librarian", "electrician"]
BUSINESSES = ["bakery", "bike repair shop", "bookstore", "yoga studio", "coffee roaster", "dog-walking service",
              "vegan restaurant", "language school", "flower shop", "climbing gym"]
GADGETS = ["smart toaster", "robot vacuum", "pair of wireless earbuds", "e-reader", "smartwatch", "electric scooter",
           "drone", "air fryer"]
EVENT_KINDS = ["book club meeting", "garden party", "board game night", "farewell dinner", "charity run", "potluck"]
WORDS = ["lantern", "whisper", "orbit", "velvet", "compass", "harbor", "ember", "meadow", "riddle", "glacier"]
PERSONAS = [
    "a pirate captain", "a medieval knight", "a tour guide in {city}", "a detective in 1920s London",
    "an astronaut on the International Space Station", "a grumpy but kind chef", "a football coach at half-time",
    "a wise old librarian", "a time traveler from the year 2300", "a friendly dragon", "a museum curator",
    "a park ranger", "a travel agent", "a personal trainer", "a Shakespearean actor", "a weather forecaster",
    "a barista who loves poetry", "a job interviewer", "a customer service agent for an airline", "a history teacher",
    "a sports commentator", "a robot butler", "a lighthouse keeper", "a fortune teller at a fair", "a ship's doctor",
    "a mountain guide", "a cat who can talk", "a radio host", "a sommelier", "a stand-up comedian",
]
ROLE_TASKS = [
    "Introduce yourself to a new crew member.", "Describe your typical day.", "Give me advice on how to {howto}.",
    "Tell me about the most exciting thing that ever happened to you.", "Convince me to visit {city}.",
    "Explain {concept} in your own style.", "React to the news that it will rain for the next {n} days.",
    "Welcome a group of visitors and explain the rules.", "Describe your favorite meal.",
    "Tell me a short story from your past in under 150 words.",
    "Answer this question in character: what makes a good friend?",
    "I'm nervous about {worry}. What do you say to me?", "Give a short speech to cheer up your team.",
]
WORRIES = ["my exam tomorrow", "moving to a new city", "my first job interview", "speaking in public",
           "a long flight", "starting a new school"]
PHILOSOPHERS = ["Plato", "Aristotle", "Confucius", "Immanuel Kant", "John Stuart Mill", "Simone de Beauvoir",
                "David Hume", "Friedrich Nietzsche", "Laozi", "Rene Descartes", "Hannah Arendt", "Epicurus",
                "Baruch Spinoza", "Mary Wollstonecraft", "Jean-Paul Sartre", "Thomas Hobbes"]
PHIL_THEMES = ["happiness", "justice", "free will", "the good life", "knowledge", "friendship", "the role of the state",
               "moral duty", "freedom", "death", "virtue", "truth"]
WORKS = ["Hamlet", "Don Quixote", "Pride and Prejudice", "The Odyssey", "Frankenstein", "One Hundred Years of Solitude",
         "Things Fall Apart", "1984", "The Great Gatsby", "Crime and Punishment", "Moby-Dick", "The Tale of Genji",
         "Jane Eyre", "Romeo and Juliet", "The Little Prince", "To Kill a Mockingbird", "Anna Karenina"]
WORK_THEMES = ["ambition", "love", "power", "identity", "loneliness", "revenge", "social class", "memory",
               "coming of age", "the individual and society", "fate", "guilt"]
ART_MOVEMENTS = ["Impressionism", "the Baroque", "Cubism", "Romanticism", "Surrealism", "the Bauhaus",
                 "Art Nouveau", "Pop Art", "Minimalism", "the Harlem Renaissance", "Ukiyo-e printmaking"]
ECON_TOPICS = ["minimum wage laws", "free trade", "universal basic income", "rent control", "carbon taxes",
               "the gig economy", "central bank independence", "tariffs", "public transport subsidies",
               "automation and jobs"]

# Synthetic documents ----------------------------------------------------------------------
PROJECTS = [
    ("a new footbridge across the river", "bridge"), ("a solar farm on the old airfield", "solar farm"),
    ("a public library in the east district", "library"), ("a bike-sharing program", "bike-sharing program"),
    ("a flood barrier along the harbor", "flood barrier"), ("a community garden network", "garden network"),
    ("a fleet of electric buses", "bus fleet"), ("a renovated central market hall", "market hall"),
    ("a new primary school", "school"), ("a tram line to the university", "tram line"),
    ("a water recycling plant", "recycling plant"), ("a heat network for older apartment blocks", "heat network"),
    ("a youth sports center", "sports center"), ("a free public wifi network", "wifi network"),
]
ORG_KINDS = ["city council", "regional transport authority", "county planning board", "municipal utility company",
             "district education office", "local housing association"]
ROLES = ["mayor", "project director", "spokesperson", "chief engineer", "council member", "planning officer"]
CONCERNS = ["the noise during construction", "the rising costs", "the loss of parking spaces", "traffic disruption",
            "the impact on local wildlife", "higher local taxes"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December"]
FIELDS = ["marine biology", "mechanical engineering", "economics", "astronomy", "linguistics", "chemistry",
          "architecture", "computer science", "medicine", "music composition", "geology", "mathematics"]
ACHIEVEMENTS = [
    "a low-cost water filter used in rural clinics", "the first detailed map of a deep-sea canyon",
    "a method for recycling lithium batteries", "a widely used textbook on statistics",
    "a bridge design that survives earthquakes",
    "a vaccine storage box that needs no electricity", "a dictionary of an endangered language",
    "an early warning system for floods", "a prize-winning symphony about the sea",
    "a new way to grow rice with less water",
]
AWARDS = ["the National Science Medal", "the Golden Compass Award", "an honorary doctorate", "the Silver Lantern Prize",
          "the Innovation Medal of her academy", "a lifetime achievement award"]
TOWN_PREFIX = ["Ash", "Bell", "Cold", "Elder", "Fair", "Green", "High", "Iron", "Mill", "North", "Oak", "Red",
               "Silver", "Stone", "West", "Wolf", "Amber", "Clear", "Fox", "Hazel"]
TOWN_SUFFIX = ["ford", "haven", "brook", "field", "wick", "stead", "mere", "bury", "ridge", "dale", "port", "hollow"]
TOWN_KINDS = ["fishing", "mountain", "river", "market", "university", "wine-growing", "mining", "lakeside"]
TOWN_FEATURES = ["its painted wooden houses", "a medieval stone bridge", "a famous cheese market", "its hot springs",
                 "a lighthouse that still works", "colorful autumn forests", "a large botanical garden",
                 "an observatory on the hill", "its clock tower", "a long sandy beach"]
INDUSTRIES = ["tourism", "fishing", "forestry", "dairy farming", "small software companies", "wine production",
              "pottery workshops", "boat building"]
FESTIVALS = ["a lantern festival", "a folk music week", "a harvest fair", "a kite-flying contest", "a jazz weekend",
             "a sailing regatta", "a film festival", "a food market on the main square"]


# ------------------------------------------------------------------------------------------
# Helpers
# ------------------------------------------------------------------------------------------

def _user(text: str) -> Messages:
    return [{"role": "user", "content": text}]


def _name(rng: random.Random) -> str:
    return rng.choice(FIRST_NAMES)


def _full_name(rng: random.Random) -> str:
    return f"{rng.choice(FIRST_NAMES)} {rng.choice(SURNAMES)}"


def _cap(s: str) -> str:
    return s[:1].upper() + s[1:]


def _fill(rng: random.Random, template: str) -> str:
    """Fill the named slots that appear in a template from the shared banks."""
    weekday, weekday2 = rng.sample(WEEKDAYS, 2)
    slots = {
        "n": rng.randint(2, 12), "k": rng.randint(1, 3), "age": rng.randint(19, 71), "hour": rng.randint(1, 11),
        "city": rng.choice(CITIES), "weekday": weekday, "weekday2": weekday2, "name": _name(rng),
        "tone": rng.choice(TONES), "audience": rng.choice(AUDIENCES), "word": rng.choice(WORDS),
        "place_noun": rng.choice(PLACE_NOUNS), "room": rng.choice(ROOMS), "relative": rng.choice(RELATIVES),
        "period": rng.choice(PERIODS), "chore": rng.choice(CHORES), "food": rng.choice(FOODS),
        "language": rng.choice(LANGUAGES), "job": rng.choice(JOBS), "business": rng.choice(BUSINESSES),
        "gadget": rng.choice(GADGETS), "event_kind": rng.choice(EVENT_KINDS), "topic": rng.choice(TOPICS),
        "howto": rng.choice(HOWTO_TASKS), "concept": rng.choice(CONCEPTS)[0], "worry": rng.choice(WORRIES),
        "sentence": _english_sentence(rng),
    }
    names = {m for m in re.findall(r"{(\w+)}", template)}
    return template.format(**{k: slots[k] for k in names})


def _words(text: str) -> list[str]:
    return text.split()


def _trim_words(text: str, max_words: int) -> str:
    """Cut text to at most max_words words, preferring to end at a sentence boundary."""
    words = text.split()
    if len(words) <= max_words:
        return text
    cut = " ".join(words[:max_words])
    end = max(cut.rfind(". "), cut.rfind("? "), cut.rfind("! "))
    if end > len(cut) // 2:
        return cut[: end + 1]
    return cut.rstrip(",;:") + "..."


# ------------------------------------------------------------------------------------------
# Passages from the standard library's docstrings
# ------------------------------------------------------------------------------------------

STDLIB_MODULES = (
    "abc argparse array ast asyncio base64 binascii bisect bz2 calendar cmd codecs collections colorsys "
    "compileall concurrent.futures configparser contextlib copy copyreg csv dataclasses datetime dbm decimal "
    "difflib dis doctest email email.message email.utils enum filecmp fileinput fnmatch fractions ftplib "
    "functools getopt gettext glob graphlib gzip hashlib heapq hmac html html.parser http http.client "
    "http.cookies http.server imaplib inspect io ipaddress itertools json keyword linecache locale logging lzma "
    "mailbox math mimetypes mmap multiprocessing netrc numbers operator optparse os os.path pathlib pdb pickle "
    "pickletools platform plistlib poplib pprint profile py_compile queue quopri random re reprlib sched secrets "
    "selectors shelve shlex shutil signal smtplib socket sqlite3 ssl stat statistics string struct subprocess "
    "tarfile tempfile textwrap threading time timeit token tokenize tomllib trace traceback tracemalloc typing "
    "unicodedata unittest urllib.parse urllib.request uuid warnings wave weakref xml.dom.minidom "
    "xml.etree.ElementTree zipapp zipfile zoneinfo"
).split()


def _clean_doc(doc: str) -> list[str]:
    """Prose paragraphs of a docstring: drops doctest examples, code blocks, tables and headers."""
    paras = []
    for block in re.split(r"\n\s*\n", inspect.cleandoc(doc)):
        lines = [ln.strip() for ln in block.strip().splitlines() if ln.strip()]
        if not lines:
            continue
        if any(ln.startswith((">>>", "...", "$", "%", "|", "+-", "==", "--")) for ln in lines):
            continue
        if sum(1 for ln in lines if re.match(r"^[\w.]+\(.*\)\s*(->.*)?$", ln)) > len(lines) / 2:
            continue  # signature lines
        text = " ".join(lines)
        words = text.split()
        if len(words) < 6:
            continue
        alpha = sum(1 for w in words if re.fullmatch(r"[A-Za-z][A-Za-z'-]*[.,;:]?", w))
        if alpha < 0.6 * len(words):
            continue
        paras.append(text)
    return paras


def _zen_of_python() -> str:
    with contextlib.redirect_stdout(io.StringIO()):
        import this  # noqa: F401  (prints the Zen when first imported)
    return "".join(this.d.get(c, c) for c in this.s)


@functools.lru_cache(maxsize=1)
def stdlib_passages() -> tuple[tuple[str, str], ...]:
    """(title, text) passages of 80-250 words from standard-library docstrings, in a fixed order."""
    out: list[tuple[str, str]] = []
    seen: set[str] = set()

    def add(title: str, paras: list[str]) -> None:
        text = _trim_words(" ".join(" ".join(paras).split()), 250)
        if len(text.split()) >= 80 and text not in seen:
            seen.add(text)
            out.append((title, text))

    for mod_name in STDLIB_MODULES:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                mod = importlib.import_module(mod_name)
        except Exception:  # a module missing from this build of Python: skip it
            continue
        if mod.__doc__:
            add(f"the {mod_name} module", _clean_doc(mod.__doc__))
        small: list[str] = []
        for name in sorted(vars(mod)):
            if name.startswith("_"):
                continue
            with warnings.catch_warnings():  # e.g. typing.io warns when touched
                warnings.simplefilter("ignore")
                obj = getattr(mod, name)
            if not (inspect.isclass(obj) or inspect.isroutine(obj)):
                continue
            owner = getattr(obj, "__module__", "") or ""
            if owner != mod_name and not owner.startswith("_" + mod_name.split(".")[-1]):
                continue
            units = [(f"{mod_name}.{name}", obj.__doc__)]
            if inspect.isclass(obj):
                for meth in sorted(vars(obj)):
                    member = vars(obj)[meth]
                    if not meth.startswith("_") and inspect.isroutine(member):
                        units.append((f"{mod_name}.{name}.{meth}", getattr(member, "__doc__", None)))
            for title, doc in units:
                if not isinstance(doc, str):
                    continue
                paras = _clean_doc(doc)
                n = len(" ".join(paras).split())
                if n >= 80:
                    add(title, paras)
                elif n >= 15:
                    small.append(f"{title.split('.', 1)[1] if '.' in title else title}: {' '.join(paras)}")
        # Group the short entries of one module into reference-style passages.
        group: list[str] = []
        for entry in small:
            group.append(entry)
            if len(" ".join(group).split()) >= 110:
                add(f"functions of the {mod_name} module", group)
                group = []
    add("the Zen of Python", [_zen_of_python().replace("\n", " ")])
    return tuple(out)


# ------------------------------------------------------------------------------------------
# Synthetic documents with known facts
# ------------------------------------------------------------------------------------------

def _news_doc(rng: random.Random) -> tuple[str, str, dict]:
    city = rng.choice(CITIES)
    project, short = rng.choice(PROJECTS)
    org = rng.choice(ORG_KINDS)
    person = _full_name(rng)
    role = rng.choice(ROLES)
    cost = rng.choice([rng.randint(2, 95), round(rng.uniform(1.2, 9.9), 1)])
    months = rng.randint(6, 40)
    people = rng.randint(3, 90) * 1000
    weekday = rng.choice(WEEKDAYS)
    concern = rng.choice(CONCERNS)
    meeting = f"{rng.choice(MONTHS)} {rng.randint(1, 28)}"
    share = rng.randint(15, 70)
    facts = {"city": city, "project": project, "short": short, "org": org, "person": person, "role": role,
             "cost": f"{cost} million euros", "months": months, "people": people, "weekday": weekday,
             "concern": concern, "meeting": meeting, "share": share}
    opening = rng.choice([
        f"The {org} of {city} announced on {weekday} that it will build {project}.",
        f"{city}'s {org} has approved plans for {project}, officials said on {weekday}.",
        f"After two years of debate, the {org} in {city} voted on {weekday} to go ahead with {project}.",
    ])
    body = [
        rng.choice([f"The project is expected to cost about {cost} million euros and to take {months} months to "
                    f"complete.",
                    f"Construction will take roughly {months} months, with a budget of {cost} million euros."]),
        rng.choice([f"According to the {org}, the {short} will serve around {people:,} residents.",
                    f"Officials estimate that about {people:,} people will benefit from the {short}."]),
        rng.choice([f"\"This is an investment in the next generation,\" said {person}, the {role} in charge.",
                    f"{person}, who serves as {role}, called the decision \"a long overdue step for {city}\"."]),
        rng.choice([f"Not everyone is convinced: some residents worry about {concern}.",
                    f"Critics have raised concerns about {concern}, and a local petition has gathered signatures."]),
        f"About {share} percent of the funding will come from national grants, with the rest paid from the city "
        f"budget.",
        rng.choice([f"A public meeting to present the detailed plans is scheduled for {meeting}.",
                    f"Residents can comment on the plans until {meeting}, when a final design will be chosen."]),
    ]
    middle = body[:4]
    rng.shuffle(middle)
    text = " ".join([opening] + middle + body[4:])
    return f"{_cap(short)} planned in {city}", text, facts


def _bio_doc(rng: random.Random) -> tuple[str, str, dict]:
    name = _full_name(rng)
    first = name.split()[0]
    born = rng.randint(1931, 1992)
    town = rng.choice(TOWN_PREFIX) + rng.choice(TOWN_SUFFIX)
    field = rng.choice(FIELDS)
    city = rng.choice(CITIES)
    achievement = rng.choice(ACHIEVEMENTS)
    founded = born + rng.randint(26, 40)
    award = rng.choice(AWARDS)
    award_year = founded + rng.randint(3, 15)
    org = f"the {rng.choice(TOWN_PREFIX)}{rng.choice(['light', 'field', 'stone', 'wave'])} Institute"
    facts = {"name": name, "born": born, "town": town, "field": field, "city": city, "achievement": achievement,
             "founded": founded, "award": award, "award_year": award_year, "org": org}
    sentences = [
        f"{name} (born {born}) is a researcher in {field}, best known for {achievement}.",
        f"{first} grew up in the small town of {town}, where {rng.choice(['her', 'his'])} parents ran "
        f"{rng.choice(['a bakery', 'a hardware store', 'a farm', 'a bookshop', 'a repair workshop'])}.",
        f"After studying {field} at a university in {city}, {first} worked for several years as a teacher "
        f"before returning to research.",
        f"In {founded}, {first} founded {org}, which today employs about {rng.randint(12, 300)} people.",
        f"The work on {achievement} began as a side project and took almost {rng.randint(3, 12)} years.",
        f"{first} received {award} in {award_year}.",
        f"Colleagues describe {first} as {rng.choice(['patient and precise', 'curious and stubborn', 'generous'])}, "
        f"and {first} still gives free public lectures every {rng.choice(MONTHS)}.",
    ]
    return f"{name}", " ".join(sentences), facts


def _town_doc(rng: random.Random) -> tuple[str, str, dict]:
    town = rng.choice(TOWN_PREFIX) + rng.choice(TOWN_SUFFIX)
    kind = rng.choice(TOWN_KINDS)
    country = rng.choice(COUNTRIES)
    population = rng.randint(2, 60) * 500
    founded = rng.randint(1150, 1890)
    feature = rng.choice(TOWN_FEATURES)
    industry = rng.choice(INDUSTRIES)
    festival = rng.choice(FESTIVALS)
    month = rng.choice(MONTHS)
    distance = rng.randint(15, 240)
    city = rng.choice(TOWN_PREFIX) + rng.choice(TOWN_SUFFIX)
    facts = {"town": town, "kind": kind, "country": country, "population": population, "founded": founded,
             "feature": feature, "industry": industry, "festival": festival, "month": month,
             "distance": distance, "city": city}
    text = " ".join([
        f"{town} is a small {kind} town in {country} with a population of about {population:,}.",
        f"It was founded in {founded} and is known above all for {feature}.",
        f"Most people in {town} work in {industry}, although many young residents commute to larger cities.",
        f"Every year in {month}, the town hosts {festival}, which attracts visitors from all over the region.",
        f"The nearest large city is {city}, about {distance} kilometers away, and a regional train connects "
        f"the two {rng.randint(2, 14)} times a day.",
        rng.choice([f"Visitors are advised to book accommodation early during {month}.",
                    "The old town center is closed to cars, so most visitors explore it on foot.",
                    "A small museum near the station tells the story of the town's founding families."]),
    ])
    return f"{town}", text, facts


SYNTH_DOCS: list[Callable[[random.Random], tuple[str, str, dict]]] = [_news_doc, _bio_doc, _town_doc]


def _synth_question(rng: random.Random, kind: str, f: dict) -> str:
    if kind == "_news_doc":
        return rng.choice([
            f"How much is the {f['short']} expected to cost?", f"Who is {f['person']}?",
            f"How long will it take to build the {f['short']}?", "What are residents worried about?",
            f"How many people will the {f['short']} serve?", "When is the public meeting about the plans?",
            "Where does the money for the project come from?", f"What did the {f['org']} announce?",
        ])
    if kind == "_bio_doc":
        first = f["name"].split()[0]
        return rng.choice([
            f"When was {f['name']} born?", f"What is {first} best known for?", f"What did {first} study?",
            f"Which organization did {first} found, and when?", f"Which award did {first} receive?",
            f"Where did {first} grow up?",
        ])
    return rng.choice([
        f"What is {f['town']} known for?", f"How many people live in {f['town']}?", f"When was {f['town']} founded?",
        f"What festival takes place in {f['town']}, and when?", f"How far is {f['town']} from {f['city']}?",
        f"What do most people in {f['town']} do for work?",
    ])


# ------------------------------------------------------------------------------------------
# Sentence generators for translation
# ------------------------------------------------------------------------------------------

def _english_sentence(rng: random.Random) -> str:
    if rng.random() < 0.5:
        return (f"{rng.choice(EN_SUBJECTS)} {rng.choice(EN_VERBS)} {rng.choice(EN_OBJECTS)} "
                f"{rng.choice(EN_PLACES)} {rng.choice(EN_TIMES)}.")
    weekday, weekday2 = rng.sample(WEEKDAYS, 2)
    return rng.choice(EN_PHRASES).format(
        place_noun=rng.choice(PLACE_NOUNS), room=rng.choice(ROOMS), n=rng.randint(2, 9), weekday=weekday,
        weekday2=weekday2, hour=rng.randint(1, 11), relative=rng.choice(RELATIVES), city=rng.choice(CITIES),
        period=rng.choice(PERIODS), chore=rng.choice(CHORES), language=rng.choice(LANGUAGES), food=rng.choice(FOODS))


def _german_text(rng: random.Random) -> str:
    if rng.random() < 0.45:
        return (f"{rng.choice(DE_SUBJECTS)} {rng.choice(DE_VERBS)} {rng.choice(DE_ADVERBIALS)} "
                f"{rng.choice(DE_OBJECTS)}.")
    first = (f"{rng.choice(DE_ACTORS)} hat {rng.choice(DE_TIMES)} {rng.choice(DE_NEWS_OBJECTS)} "
             f"{rng.choice(DE_PARTICIPLES)}.")
    extra = [s.format(n=rng.randint(2, 400)) for s in rng.sample(DE_EXTRA, rng.randint(0, 2))]
    return " ".join([first] + extra)


def _romance_text(rng: random.Random) -> tuple[str, str]:
    if rng.random() < 0.5:
        return "French", (f"{rng.choice(FR_SUBJECTS)} {rng.choice(FR_VERBS)} {rng.choice(FR_OBJECTS)} "
                          f"{rng.choice(FR_ADVERBIALS)}.")
    return "Spanish", (f"{rng.choice(ES_SUBJECTS)} {rng.choice(ES_VERBS)} {rng.choice(ES_OBJECTS)} "
                       f"{rng.choice(ES_ADVERBIALS)}.")


def _doc_sentence(rng: random.Random) -> str:
    title, text = rng.choice(stdlib_passages())
    sentences = [s for s in re.split(r"(?<=[.!?])\s+", text) if 8 <= len(s.split()) <= 35]
    return rng.choice(sentences) if sentences else _english_sentence(rng)


# ------------------------------------------------------------------------------------------
# Category generators: each returns one message list for a random draw
# ------------------------------------------------------------------------------------------

def gen_translation(rng: random.Random) -> Messages:
    r = rng.random()
    lang = rng.choice(LANGUAGES)
    if r < 0.35:
        de = _german_text(rng)
        return _user(rng.choice([f"Translate German to English: {de}",
                                 f"Translate this German text into English:\n\n{de}",
                                 f"What does this mean in English? \"{de}\"", f"German: {de}\nEnglish:"]))
    if r < 0.5:
        src_lang, src = _romance_text(rng)
        return _user(rng.choice([f"Translate {src_lang} to English: {src}",
                                 f"Please translate this {src_lang} sentence into English: \"{src}\"",
                                 f"Translate into German: {src}"]))
    if r < 0.65:
        text = " ".join(_english_sentence(rng) for _ in range(rng.randint(2, 3)))
        return _user(rng.choice([f"Translate the following text into {lang}:\n\n{text}",
                                 f"Translate into {lang}, keeping a {rng.choice(['formal', 'casual'])} "
                                 f"tone:\n\n{text}"]))
    if r < 0.8:
        s = _doc_sentence(rng)
        return _user(rng.choice([f"Translate this technical sentence into {lang}: {s}",
                                 f"Translate to {lang} and keep code names unchanged:\n{s}"]))
    s = _english_sentence(rng)
    return _user(rng.choice([f"Translate the following sentence into {lang}: {s}", f"How do you say \"{s}\" in {lang}?",
                             f"Translate English to {lang}: {s}", f"{s}\n\nTranslate the sentence above into {lang}.",
                             f"Give me the {lang} translation of: {s}"]))


SUMMARY_INSTRUCTIONS = [
    "Summarize the following text in two sentences.", "Summarize the following document:",
    "Write a one-paragraph summary of this passage.",
    "Give a bullet-point summary (at most four bullets) of the text below.",
    "TL;DR the following:", "Summarize this for someone who has never programmed.",
    "What is the main point of this passage? Answer in one sentence.",
    "Write a short headline and a one-sentence summary for this text.",
    "Condense the following into about 50 words.", "Summarize the key ideas of the text below for a busy reader.",
    "Read the passage and write a brief summary.", "Explain the gist of this text in plain English.",
]


def _passage(rng: random.Random, stdlib_share: float) -> tuple[str, str, str, dict]:
    """(source kind, title, text, facts). stdlib passages have no facts."""
    if rng.random() < stdlib_share:
        title, text = rng.choice(stdlib_passages())
        return "stdlib", title, text, {}
    fn = rng.choice(SYNTH_DOCS)
    title, text, facts = fn(rng)
    return fn.__name__, title, text, facts


def gen_summarization(rng: random.Random) -> Messages:
    kind, title, text, _ = _passage(rng, 0.6)
    instr = rng.choice(SUMMARY_INSTRUCTIONS)
    if rng.random() < 0.2:
        return _user(f"{text}\n\n{instr.rstrip(':')}")
    if rng.random() < 0.2 and kind == "stdlib":
        where = title.removeprefix("functions of ")
        return _user(f"Here is part of the documentation of {where}.\n\n{text}\n\n{instr}")
    return _user(f"{instr}\n\n{text}")


def _stdlib_question(rng: random.Random, title: str) -> str:
    """A question about a docstring passage; titles are 'the X module', 'functions of the X module' or 'X.name'."""
    if title.endswith(" module"):
        name = title.split(" ")[-2]
        return rng.choice([f"What is the {name} module used for?", "Which functions does the passage mention?",
                           "What is the main idea of this documentation?", f"Name two things you can do with {name}."])
    name = f"`{title}`" if title != "the Zen of Python" else title
    return rng.choice([f"What does {name} do?", f"According to the documentation, what does {name} return?",
                       f"What arguments does {name} accept?", f"When would you use {name}?",
                       f"What happens if {name} is given invalid input, according to the text?",
                       f"Describe {name} in one sentence."])


def gen_rag(rng: random.Random) -> Messages:
    kind, title, text, facts = _passage(rng, 0.5)
    q = _stdlib_question(rng, title) if kind == "stdlib" else _synth_question(rng, kind, facts)
    r = rng.random()
    if r < 0.35:
        others = [_passage(rng, 0.5) for _ in range(rng.randint(1, 2))]
        docs = [(title, _trim_words(text, 170))] + [(o[1], _trim_words(o[2], 100)) for o in others]
        rng.shuffle(docs)
        body = "\n".join(f"Document [{i + 1}] (Title: {t}) {d}" for i, (t, d) in enumerate(docs))
        return _user(f"Answer the question based on the documents below.\n\n{body}\n\nQuestion: {q}\nAnswer:")
    return _user(rng.choice([
        f"Use the following passage to answer the question.\n\nPassage: {text}\n\nQuestion: {q}",
        f"Context:\n{text}\n\nBased on the context above, answer: {q}",
        f"{text}\n\nQ: {q}\nA:",
        f"Read the text and answer the question using only information from it.\n\nText: {text}\n\nQuestion: {q}",
        f"Here is some reference material:\n\"\"\"\n{text}\n\"\"\"\n{q} If the material does not say, reply that you "
        f"don't know.",
    ]))


def gen_qa(rng: random.Random) -> Messages:
    r = rng.random()
    if r < 0.12:
        q = f"What is {rng.choice(CONCEPTS)[0]}?"
    elif r < 0.22:
        q = rng.choice([f"Who was {rng.choice(PEOPLE)}?", f"What is {rng.choice(PEOPLE)} best known for?"])
    elif r < 0.32:
        q = rng.choice([f"When did {rng.choice(EVENTS)} happen?", f"What caused {rng.choice(EVENTS)}?",
                        f"Why was {rng.choice(EVENTS)} important?"])
    elif r < 0.42:
        c = rng.choice(COUNTRIES)
        q = rng.choice([f"What is the capital of {c}?", f"What languages are spoken in {c}?",
                        f"What currency is used in {c}?", f"What is {c} famous for?",
                        f"What is the climate like in {c}?"])
    elif r < 0.5:
        q = rng.choice(WHY_QUESTIONS)
    elif r < 0.58:
        q = rng.choice(TRIVIA)
    elif r < 0.68:
        q = f"How do I {rng.choice(HOWTO_TASKS)}?"
    elif r < 0.78:
        a, b = rng.choice(QA_PAIRS)
        q = rng.choice([f"What is the difference between {a} and {b}?", f"How can I tell {a} from {b}?"])
    elif r < 0.84:
        small, big = rng.choice(UNIT_PAIRS)
        q = rng.choice([f"What does {rng.choice(ABBREVIATIONS)} stand for?", f"How many {small} are in a {big}?"])
    elif r < 0.92:
        lm = rng.choice(LANDMARKS)
        q = rng.choice([f"Where is {lm} located?", f"Who built {lm}?", f"Why is {lm} famous?"])
    else:
        q = f"Who invented {rng.choice(INVENTIONS)}?"
    style = rng.random()
    if style < 0.25:  # Natural-Questions style: lower case, no question mark
        q = q.rstrip("?").lower()
    elif style < 0.35:
        q = f"{q} Answer briefly."
    elif style < 0.42:
        q = f"Quick question: {q[0].lower()}{q[1:]}"
    return _user(q)


def _money(x: float) -> str:
    return f"${x:,.2f}" if x != int(x) else f"${int(x):,}"


MATH_SUFFIXES = ["", "", "", " Show your work.", " Think step by step.", " Explain your reasoning.",
                 " Give the final answer on its own line.", " Let's think step by step."]
ITEMS = [("notebook", "notebooks"), ("apple", "apples"), ("pencil", "pencils"), ("cupcake", "cupcakes"),
         ("ticket", "tickets"), ("marble", "marbles"), ("sticker", "stickers"), ("book", "books"), ("egg", "eggs"),
         ("seedling", "seedlings"), ("bottle of juice", "bottles of juice"), ("comic", "comics")]


def _math_problem(rng: random.Random) -> str:
    a, b = _name(rng), _name(rng)
    item, items = rng.choice(ITEMS)
    n1, n2, n3 = rng.randint(3, 40), rng.randint(2, 25), rng.randint(2, 12)
    price = rng.choice([0.5, 0.75, 1.25, 2, 3, 4.5, 6, 12])
    pct = rng.choice([10, 15, 20, 25, 30, 40, 50])
    templates = [
        f"{a} has {n1} {items}. {b} gives {a} {n2} more, and then {a} gives away {n3}. How many {items} does {a} "
        f"have now?",
        f"A store sells {items} for {_money(price)} each. {a} buys {n1} {items} and pays with a "
        f"${min(bill for bill in (10, 20, 50, 100, 200, 500) if bill > n1 * price)} bill. "
        f"How much change does {a} get?",
        f"{a} reads {n2} pages every day. The book has {n2 * n1 + n3} pages. How many days does it take to finish "
        f"the book?",
        f"A train travels at {rng.randint(40, 140)} km/h for {n3} hours and then at {rng.randint(40, 140)} km/h for "
        f"{rng.randint(1, 6)} more hours. How far does it travel in total?",
        f"A jacket costs {_money(rng.randint(30, 250))}. It is on sale for {pct}% off. What is the sale price?",
        f"{a} is {n2} years old. {b} is {n3} years older than twice {a}'s age. How old is {b}?",
        f"There are {n1 + n2} students in a class. {pct}% of them walk to school and the rest take the bus. "
        f"How many take the bus?",
        f"A rectangle is {n1} cm long and {n2} cm wide. What are its area and its perimeter?",
        f"{a} saves {_money(rng.randint(5, 60))} each week. How many weeks will it take to save "
        f"{_money(rng.randint(200, 1500))}?",
        f"A recipe needs {n3} eggs for {rng.randint(2, 6)} people. How many eggs are needed for "
        f"{rng.randint(7, 30)} people?",
        f"{a} worked {n3} hours on Monday, {rng.randint(2, 10)} hours on Tuesday and {rng.randint(2, 10)} hours on "
        f"Wednesday, earning {_money(rng.randint(12, 45))} per hour. How much did {a} earn?",
        f"The average of four numbers is {n1}. Three of them are {n2}, {n3} and {n1 + n3}. What is the fourth number?",
        f"A tank holds {rng.randint(100, 900)} liters. It is filled at {rng.randint(5, 40)} liters per minute. "
        f"How long "
        f"does it take to fill the tank from empty?",
        f"Solve for x: {rng.randint(2, 12)}x + {rng.randint(1, 50)} = {rng.randint(51, 200)}.",
        f"Solve the system of equations: x + y = {n1 + n2}, x - y = {n1 - n2}.",
        f"What is {rng.randint(12, 99)} multiplied by {rng.randint(12, 99)}?",
        f"What is {pct}% of {rng.randint(40, 2000)}?",
        f"{a} invests {_money(rng.randint(1, 20) * 500)} at {rng.randint(2, 9)}% annual interest, compounded yearly. "
        f"How much is the investment worth after {n3} years?",
        f"A bag has {n2} red marbles and {n3} blue marbles. If you pick one marble at random, what is the probability "
        f"that it is blue?",
        f"{a} and {b} share {n1 * 6} {items} in the ratio {rng.randint(1, 5)}:{rng.randint(1, 5)}. How many does "
        f"each get?",
        f"A car uses {rng.randint(4, 12)} liters of fuel per 100 km. Fuel costs {_money(rng.choice([1.5, 1.8, 2.1]))} "
        f"per liter. How much does a {rng.randint(50, 900)} km trip cost?",
        f"What is the sum of all integers from 1 to {rng.randint(20, 500)}?",
        f"A shop sold {n1} {items} on Monday and {pct}% more on Tuesday. How many {items} did it sell over the "
        f"two days?",
        f"{a} runs {rng.randint(3, 15)} km in {rng.randint(18, 95)} minutes. What is {a}'s average speed in km/h?",
        f"A pizza is cut into {rng.choice([6, 8, 10, 12])} slices. {a} eats {rng.randint(2, 3)} slices and {b} eats "
        f"{rng.randint(1, 3)}. What fraction of the pizza is left?",
        f"If {n3} workers can build a wall in {n2} days, how long would it take {n3 + rng.randint(1, 8)} workers "
        f"working "
        f"at the same rate?",
        f"What is the least common multiple of {n1} and {n2 + 2}?",
        f"Convert {rng.randint(1, 20) * 1000 + rng.randint(0, 999)} seconds into hours, minutes and seconds.",
        f"A phone plan costs {_money(rng.randint(10, 40))} per month plus {_money(rng.choice([0.05, 0.1, 0.25]))} per "
        f"text message. {a} sends {rng.randint(20, 400)} messages in a month. What is the bill?",
        f"The sides of a right triangle are {n2} and {n3 + 3}. How long is the hypotenuse?",
        f"{a} buys {n3} {items} at {_money(price)} each and {n2} more at {_money(price * 2)} each. What is the "
        f"total cost?",
    ]
    return rng.choice(templates)


def gen_math_reasoning(rng: random.Random) -> Messages:
    q = _math_problem(rng)
    if rng.random() < 0.1:
        q = f"{q} Also check that your answer makes sense."
    return _user(q + rng.choice(MATH_SUFFIXES))


LOGIC_PUZZLES = [
    "{a} is taller than {b}. {b} is taller than {c}. Is {c} taller than {a}? Explain.",
    "{a}, {b} and {c} finished a race. {a} was not first. {c} finished right after {b}. In what order did they finish?",
    "All {xs} are {ys}. Some {ys} are {zs}. Does it follow that some {xs} are {zs}? Explain your reasoning.",
    "If today is {weekday}, what day of the week will it be in {n} days?",
    "What is the next number in the sequence {seq}? Explain the pattern.",
    "{a} says: \"{b} is lying.\" {b} says: \"{c} is lying.\" {c} says: \"Both {a} and {b} are lying.\" Who is "
    "telling the truth?",
    "A farmer has chickens and cows. There are {heads} heads and {legs} legs in total. How many of each animal "
    "are there?",
    "In the {s} family, each son has as many brothers as sisters, and each daughter has twice as many brothers as "
    "sisters. How many sons and daughters are there?",
    "Three boxes are labeled apples, oranges and mixed, and every label is wrong. You may take one fruit from one box. "
    "How can you relabel all the boxes correctly? Explain using {a} as the person choosing.",
    "If it takes {n} machines {n} minutes to make {n} widgets, how long would it take {m} machines to make {m} "
    "widgets?",
    "{a} is older than {b} but younger than {c}. {d} is younger than {b}. Who is the second oldest?",
    "A clock shows {hour}:{minute:02d}. What is the angle between the hour and minute hands?",
]
CLASSES = [("cats", "mammals", "pets"), ("roses", "flowers", "red things"), ("squares", "rectangles", "small shapes"),
           ("violinists", "musicians", "teachers"), ("sparrows", "birds", "brown animals")]


def gen_reasoning(rng: random.Random) -> Messages:
    t = rng.choice(LOGIC_PUZZLES)
    a, b, c, d = rng.sample(FIRST_NAMES, 4)
    start, step = rng.randint(1, 20), rng.randint(2, 9)
    seq_kind = rng.random()
    if seq_kind < 0.4:
        seq = [start + step * i for i in range(5)]
    elif seq_kind < 0.7:
        seq = [start * (step // 3 + 2) ** i for i in range(5)]
    else:
        seq = [start + i * i for i in range(5)]
    cows = rng.randint(2, 20)
    hens = rng.randint(2, 20)
    xs, ys, zs = rng.choice(CLASSES)
    n = rng.randint(3, 9)
    text = t.format(a=a, b=b, c=c, d=d, s=rng.choice(SURNAMES), xs=xs, ys=ys, zs=zs, weekday=rng.choice(WEEKDAYS), n=n,
                    m=n * rng.randint(2, 20), seq=", ".join(map(str, seq)) + ", ...", heads=cows + hens,
                    legs=4 * cows + 2 * hens, hour=rng.randint(1, 12), minute=rng.choice([0, 15, 20, 30, 45, 50]))
    return _user(text + rng.choice(["", "", " Think it through carefully.", " Explain step by step."]))


@functools.lru_cache(maxsize=1)
def _stdlib_functions() -> tuple[tuple[str, str], ...]:
    """(qualified name, source) of small pure-Python standard-library functions."""
    out = []
    for mod_name in ("textwrap", "string", "bisect", "heapq", "statistics", "shlex", "fnmatch", "posixpath", "glob",
                     "calendar", "colorsys", "difflib", "functools", "random", "base64", "json.encoder", "csv",
                     "ipaddress", "fractions", "html", "urllib.parse", "copy", "pprint", "quopri", "uu"):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                mod = importlib.import_module(mod_name)
        except Exception:
            continue
        for name in sorted(vars(mod)):
            obj = getattr(mod, name)
            if name.startswith("__") or not inspect.isfunction(obj) or obj.__module__ != mod.__name__:
                continue
            try:
                src = textwrap.dedent(inspect.getsource(obj))
            except (OSError, TypeError):
                continue
            n_lines = src.count("\n")
            if 4 <= n_lines <= 30 and len(src) < 1400:
                out.append((f"{mod_name}.{name}", src))
    return tuple(out)


def _strip_docstring(src: str) -> str:
    import ast

    tree = ast.parse(src)
    fn = tree.body[0]
    if (fn.body and isinstance(fn.body[0], ast.Expr) and isinstance(fn.body[0].value, ast.Constant)
            and isinstance(fn.body[0].value.value, str)):
        fn.body = fn.body[1:] or [ast.Pass()]
    return ast.unparse(tree) + "\n"


def gen_coding(rng: random.Random) -> Messages:
    r = rng.random()
    name, desc = rng.choice(FUNCTION_SPECS)
    lang = rng.choice(LANGS_CODE)
    if r < 0.42:
        return _user(rng.choice([
            f"Write a {lang} function `{name}` that {desc}.",
            f"Implement a function in {lang} that {desc}. Include a short explanation.",
            f"Write a {lang} function that {desc}, and add a few test cases.",
            f"How would I write code that {desc} in {lang}?",
            f"Can you write an efficient {lang} solution for this: a function that {desc}? State its time complexity.",
            f"I need a {lang} helper that {desc}. Keep it short and readable.",
        ]))
    if r < 0.62:
        fn_name, src = rng.choice(_stdlib_functions())
        short = fn_name.rsplit(".", 1)[-1]
        if rng.random() < 0.3:
            src = _strip_docstring(src)
            return _user(rng.choice([f"Add a docstring and type hints to this Python function:\n\n```python\n{src}```",
                                     f"Write unit tests with pytest for this function:\n\n```python\n{src}```"]))
        return _user(rng.choice([
            f"Explain what the following Python function does:\n\n```python\n{src}```",
            f"Walk me through this code line by line:\n\n```python\n{src}```",
            f"What is `{short}` doing here, and can you suggest any improvements?\n\n```python\n{src}```",
            f"Rewrite this Python function in {rng.choice(LANGS_CODE[6:])}:\n\n```python\n{src}```",
        ]))
    if r < 0.72:
        snippet, expect = rng.choice(BUGGY_SNIPPETS)
        return _user(rng.choice([f"This code has a bug. {expect} Find and fix it.\n\n```\n{snippet}```",
                                 f"Why doesn't this work? {expect}\n\n```\n{snippet}```",
                                 f"Review this code and point out any problems:\n\n```\n{snippet}```"]))
    if r < 0.82:
        return _user(rng.choice([f"Write an SQL query that {rng.choice(SQL_TASKS)}.",
                                 f"Given tables customers, orders and products, write SQL that "
                                 f"{rng.choice(SQL_TASKS)}."]))
    if r < 0.9:
        return _user(rng.choice([f"Write a regular expression that matches {rng.choice(REGEX_TARGETS)}.",
                                 f"How do I {rng.choice(SHELL_TASKS)} on Linux?",
                                 f"Give me a shell one-liner to {rng.choice(SHELL_TASKS)}."]))
    topic = rng.choice([
        "the difference between a list and a generator in Python", "what a race condition is",
        "when to use a hash map instead of a list", "how garbage collection works", "what Big-O notation means",
        "the difference between processes and threads", "what a REST API is", "how git branches work",
        "why immutability helps in concurrent code", "what dependency injection is",
        "how a hash table handles collisions",
        "what unit tests and integration tests are", "how HTTPS keeps data private", "what a closure is in JavaScript",
        "the difference between SQL and NoSQL databases", "what recursion depth limits are",
    ])
    return _user(rng.choice([f"Explain {topic}.", f"Can you explain {topic} with a short code example?",
                             f"In simple terms, {topic}?".replace("In simple terms, the",
                             "In simple terms, what is the")]))


def gen_writing(rng: random.Random) -> Messages:
    if rng.random() < 0.55:
        form = rng.choice(WRITING_FORMS)
        text = f"Write {form} about {rng.choice(TOPICS)}."
        extra = _fill(rng, rng.choice(WRITING_CONSTRAINTS))
        return _user(f"{text} {extra}".strip())
    return _user(_fill(rng, rng.choice(WRITING_TASKS)))


def gen_roleplay(rng: random.Random) -> Messages:
    persona = _fill(rng, rng.choice(PERSONAS))
    task = _fill(rng, rng.choice(ROLE_TASKS))
    return _user(rng.choice([f"Pretend you are {persona}. {task}", f"You are {persona}. Stay in character. {task}",
                             f"Act as {persona}. {task}", f"Role-play as {persona}. {task}"]))


def gen_stem(rng: random.Random) -> Messages:
    concept, _ = rng.choice(CONCEPTS)
    r = rng.random()
    if r < 0.6:
        return _user(rng.choice([
            f"Explain {concept} in simple terms.", f"Explain {concept} to {rng.choice(AUDIENCES)}.",
            f"What are the main applications of {concept}?", f"Describe how {concept} works, step by step.",
            f"What are common misconceptions about {concept}?", f"Write a short lesson plan to teach {concept}.",
            f"How would you explain {concept} using an everyday analogy?",
            f"What experiments or evidence support our understanding of {concept}?",
        ]))
    m, v, t = rng.randint(1, 90), rng.randint(2, 40), rng.randint(2, 20)
    compounds = ["water (H2O)", "carbon dioxide (CO2)", "glucose (C6H12O6)", "sodium chloride (NaCl)", "ammonia (NH3)",
                 "sulfuric acid (H2SO4)", "methane (CH4)", "calcium carbonate (CaCO3)", "ethanol (C2H5OH)"]
    return _user(rng.choice([
        f"A ball is dropped from a height of {m} meters. Ignoring air resistance, how long does it take to hit the "
        f"ground, and how fast is it moving?",
        f"A car accelerates from rest to {v} m/s in {t} seconds. What is its acceleration and how far does it travel?",
        f"A resistor of {m} ohms is connected to a {v} volt battery. What current flows, and how much power is used?",
        f"What is the molar mass of {rng.choice(compounds)}? Show the calculation.",
        f"An object of mass {m} kg moves at {v} m/s. What is its kinetic energy?",
        f"How much energy is needed to heat {t} liters of water from {v} degrees C to boiling?",
        f"A wave has a frequency of {m * 10} Hz and a wavelength of {t / 10} m. What is its speed?",
        f"Find the derivative of f(x) = {t}x^3 - {v}x^2 + {m}x and explain each step.",
        f"Compute the integral of {t}x^2 + {v} from 0 to {rng.randint(1, 6)}.",
        f"A population of bacteria doubles every {t} minutes. Starting from {m} cells, how many are there after "
        f"{t * rng.randint(2, 6)} minutes?",
    ]))


def gen_humanities(rng: random.Random) -> Messages:
    r = rng.random()
    if r < 0.25:
        p1, p2 = rng.sample(PHILOSOPHERS, 2)
        theme = rng.choice(PHIL_THEMES)
        return _user(rng.choice([f"Compare the views of {p1} and {p2} on {theme}.",
                                 f"What did {p1} believe about {theme}?",
                                 f"Summarize {p1}'s main ideas for a beginner."]))
    if r < 0.5:
        w, theme = rng.choice(WORKS), rng.choice(WORK_THEMES)
        return _user(rng.choice([f"Discuss the theme of {theme} in {w}.", f"Why is {w} still read today?",
                                 f"Write a short essay plan on {theme} in {w}."]))
    if r < 0.7:
        e = rng.choice(EVENTS)
        return _user(rng.choice([f"What were the main causes and consequences of {e}?",
                                 f"How did {e} change everyday life for ordinary people?",
                                 f"Write a short explanation of {e} for a history class."]))
    if r < 0.85:
        a = rng.choice(ART_MOVEMENTS)
        return _user(rng.choice([f"What are the defining features of {a}?", f"Name three important artists of {a} and "
                                 f"describe their styles.", f"How did {a} influence later art?"]))
    t = rng.choice(ECON_TOPICS)
    return _user(rng.choice([f"What are the arguments for and against {t}?", f"Explain the economics of {t}.",
                             f"How might {t} affect small businesses?"]))


def _records_paragraph(rng: random.Random) -> tuple[str, str]:
    kind = rng.choice(["people", "books", "products"])
    if kind == "people":
        rows = [(_full_name(rng), rng.choice(JOBS), rng.randint(22, 65), rng.choice(CITIES))
                for _ in range(rng.randint(3, 5))]
        text = " ".join(f"{n} is a {rng.choice(['', 'senior ', 'part-time '])}{j} aged {a} who lives in {c}."
                        for n, j, a, c in rows)
        return text, "name, job, age and city"
    if kind == "books":
        rows = [(f"The {rng.choice(['Silent', 'Last', 'Hidden', 'Golden', 'Broken', 'Endless'])} "
                 f"{rng.choice(['River', 'Garden', 'Letter', 'Winter', 'Map', 'Orchard'])}", _full_name(rng),
                 rng.randint(1950, 2023)) for _ in range(rng.randint(3, 5))]
        text = " ".join(f"\"{t}\" was written by {a} and published in {y}." for t, a, y in rows)
        return text, "title, author and year"
    rows = [(rng.choice(GADGETS), rng.randint(19, 899), rng.randint(1, 5)) for _ in range(rng.randint(3, 5))]
    text = " ".join(f"The {g} costs ${p} and customers rate it {s} out of 5." for g, p, s in rows)
    return text, "product, price and rating"


def gen_extraction(rng: random.Random) -> Messages:
    r = rng.random()
    if r < 0.4:
        fn = rng.choice(SYNTH_DOCS)
        _, text, facts = fn(rng)
        keys = rng.sample(sorted(facts), min(4, len(facts)))
        return _user(rng.choice([
            f"Extract the following fields from the text as JSON: {', '.join(keys)}.\n\n{text}",
            f"List every number in this text and say what it refers to.\n\n{text}",
            f"Extract all names of people and places from the text below.\n\n{text}",
            f"{text}\n\nFrom the text above, extract the key facts as a bulleted list.",
        ]))
    if r < 0.75:
        text, fields = _records_paragraph(rng)
        return _user(rng.choice([f"Extract the {fields} from this text and return a JSON list.\n\n{text}",
                                 f"Turn this text into a Markdown table with columns for {fields}:\n\n{text}",
                                 f"Convert the following into CSV ({fields}):\n{text}"]))
    title, text = rng.choice(stdlib_passages())
    return _user(rng.choice([f"List all the function or class names mentioned in the following text.\n\n{text}",
                             f"Extract every parameter or argument name mentioned in this documentation:\n\n{text}",
                             f"From the documentation below, extract a list of what the code can do, one item per "
                             f"line.\n\n{text}"]))


def gen_conversation(rng: random.Random) -> Messages:
    r = rng.random()
    if r < 0.35:
        concept, desc = rng.choice(CONCEPTS)
        opener = rng.choice([f"What is {concept}?", f"Can you explain {concept}?", f"I keep hearing about {concept}. "
                             f"What is it?", f"Tell me about {concept}."])
        reply = rng.choice([
            f"The term \"{concept}\" refers to {desc}. Would you like me to go into more detail on any part of it?",
            f"In short, {concept} describes {desc}. It comes up in many fields, so it is worth understanding well.",
            f"Sure! When people talk about {concept}, they mean {desc}. Let me know if you want an example.",
        ])
        msgs = [{"role": "user", "content": opener}, {"role": "assistant", "content": reply}]
        follow = rng.choice(FOLLOW_UPS)
        if concept in OTHER_CONCEPT and rng.random() < 0.4:
            follow = f"How is it different from {OTHER_CONCEPT[concept]}?"
        if rng.random() < 0.3:
            msgs += [{"role": "user", "content": follow},
                     {"role": "assistant", "content": rng.choice([
                         f"Good question. The key idea to hold on to is {desc}; the details build on that.",
                         f"Think of it this way: {concept} is about {desc}. Everything else follows from that."])}]
            follow = rng.choice([f for f in FOLLOW_UPS if f != follow])
        return msgs + [{"role": "user", "content": follow}]
    if r < 0.6:
        goal = rng.choice(sorted(GOALS))
        tips = GOALS[goal]
        chosen = rng.sample(tips, 3)
        opener = rng.choice([f"I want to {goal}. Any advice?", f"Give me three tips to {goal}.",
                             f"How can I {goal}?"])
        if rng.random() < 0.5:
            reply = "Here are three ideas:\n" + "\n".join(f"{i + 1}. {_cap(t)}." for i, t in enumerate(chosen))
            follow = _fill(rng, rng.choice(LIST_FOLLOW_UPS))
        else:
            reply = (f"That's a great goal! A few things help: {chosen[0]}, {chosen[1]} and {chosen[2]}. "
                     f"What does your situation look like right now?")
            follow = f"{_fill(rng, rng.choice(SITUATIONS))}. What should I do first?"
        return [{"role": "user", "content": opener}, {"role": "assistant", "content": reply},
                {"role": "user", "content": follow}]
    if r < 0.75:
        a = _name(rng)
        qty, unit_price = rng.randint(3, 30), rng.choice([2, 3, 4, 5, 8, 12, 15])
        item, items = rng.choice(ITEMS)
        total = qty * unit_price
        opener = f"{a} buys {qty} {items} at ${unit_price} each. How much does {a} spend?"
        reply = f"Each {item} costs ${unit_price}, so {qty} {items} cost {qty} x {unit_price} = ${total}."
        pct = rng.choice([10, 20, 25, 50])
        follow = rng.choice([f"What if there is a {pct}% discount on the whole purchase?",
                             f"And if {a} pays with a ${(total // 50 + 1) * 50} bill, what is the change?",
                             f"How many more {items} could {a} buy with another ${unit_price * rng.randint(2, 9)}?",
                             "Can you explain that to a child using a picture or story?"])
        return [{"role": "user", "content": opener}, {"role": "assistant", "content": reply},
                {"role": "user", "content": follow}]
    if r < 0.88:
        city = rng.choice(CITIES)
        days = rng.randint(2, 7)
        interest = rng.choice(["food", "museums", "hiking", "history", "nightlife", "architecture", "markets",
                               "beaches"])
        msgs = [{"role": "user", "content": rng.choice([f"I'm planning a trip to {city}.", f"I'm going to {city} soon!",
                                                        f"Help me plan a visit to {city}."])},
                {"role": "assistant", "content": rng.choice([
                    f"How exciting! {city} has a lot to offer. How many days will you stay, and what do you enjoy?",
                    f"Great choice. To suggest a plan, could you tell me how long you'll be in {city} and your "
                    f"interests?"])},
                {"role": "user", "content": f"{days} days, and I really like {interest}. "
                                            + rng.choice(["What should I do?", "Can you make a day-by-day plan?",
                                                          "What would you recommend?"])}]
        return msgs
    topic = rng.choice(TOPICS)
    form = rng.choice(["a short poem", "a two-sentence story", "a slogan", "a title for a blog post"])
    reply = rng.choice([f"Here's an attempt: \"{_cap(topic)}, quiet and near, / a small bright thing that brings "
                        f"us here.\"",
                        f"How about this: \"Everyone remembers {topic}, but nobody remembers how it began.\"",
                        f"Here is one: \"{_cap(topic)}: more than it seems.\""])
    follow = rng.choice(["Make it funnier.", "Now make it longer and more detailed.", "Rewrite it for children.",
                         "Can you give me three alternative versions?", "Make it rhyme better.",
                         f"Now write it in the style of a "
                         f"{rng.choice(['news report', 'fairy tale', 'sports commentary'])}."])
    return [{"role": "user", "content": f"Write {form} about {topic}."}, {"role": "assistant", "content": reply},
            {"role": "user", "content": follow}]


GENERATORS: dict[str, Callable[[random.Random], Messages]] = {
    "conversation": gen_conversation,
    "translation": gen_translation,
    "summarization": gen_summarization,
    "qa": gen_qa,
    "math_reasoning": gen_math_reasoning,
    "rag": gen_rag,
    "coding": gen_coding,
    "writing": gen_writing,
    "roleplay": gen_roleplay,
    "stem": gen_stem,
    "humanities": gen_humanities,
    "extraction": gen_extraction,
    "reasoning": gen_reasoning,
}


# ------------------------------------------------------------------------------------------
# Public API
# ------------------------------------------------------------------------------------------

def prompt_text(record: dict) -> str:
    """All message contents of a prompt joined by newlines (for length checks and overlap tests)."""
    return "\n".join(m["content"] for m in record["messages"])


def _category_prompts(category: str, n: int, seed: int) -> list[dict]:
    rng = random.Random(f"{seed}-{category}")
    gen = GENERATORS[category]
    seen: set[str] = set()
    out: list[dict] = []
    attempts = 0
    while len(out) < n:
        attempts += 1
        if attempts > 200 * n:
            raise RuntimeError(f"could only make {len(out)} distinct {category} prompts (wanted {n})")
        msgs = gen(rng)
        key = json.dumps(msgs, sort_keys=True)
        text = prompt_text({"messages": msgs})
        if key in seen or len(text.split()) > MAX_PROMPT_WORDS or len(text) > MAX_PROMPT_CHARS:
            continue
        seen.add(key)
        out.append({"prompt_id": f"{category}-{len(out):05d}", "category": category, "messages": msgs})
    return out


def training_prompts(seed: int = 0, counts: dict[str, int] | None = None) -> list[dict]:
    """The training prompts for one seed, grouped by category in a fixed order."""
    counts = CATEGORY_COUNTS if counts is None else counts
    out: list[dict] = []
    for category, n in counts.items():
        out.extend(_category_prompts(category, n, seed))
    return out


# ------------------------------------------------------------------------------------------
# Evaluation questions: disjointness from the training prompts
# ------------------------------------------------------------------------------------------

def _norm_words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9äöüßéèàçñ']+", text.lower())


def _shingles(words: list[str], k: int = SHINGLE) -> set[int]:
    return {hash(" ".join(words[i:i + k])) for i in range(len(words) - k + 1)}


def read_questions(path: str | Path) -> list[dict]:
    """Spec-Bench questions, one JSON object per line (blank lines skipped)."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def assert_disjoint(train_prompts: Iterable[dict], eval_path: str | Path, k: int = SHINGLE) -> None:
    """Raise AssertionError if an eval turn appears in, or shares a k-word shingle with, a training prompt.

    Texts are compared after lower-casing and keeping only word characters, so punctuation and
    spacing differences do not hide a copy.
    """
    train_texts = [" ".join(_norm_words(prompt_text(p))) for p in train_prompts]
    train_shingles: set[int] = set()
    for t in train_texts:
        train_shingles |= _shingles(t.split(), k)
    corpus = " " + " ".join(train_texts) + " "
    problems = []
    for q in read_questions(eval_path):
        for i, turn in enumerate(q["turns"]):
            words = _norm_words(turn)
            norm = " ".join(words)
            if len(words) >= 4 and f" {norm} " in corpus:
                problems.append(f"question {q['question_id']} turn {i}: text appears in a training prompt")
            elif _shingles(words, k) & train_shingles:
                problems.append(f"question {q['question_id']} turn {i}: shares a {k}-word shingle with training")
    assert not problems, "eval prompts overlap the training prompts:\n" + "\n".join(problems)


# ------------------------------------------------------------------------------------------
# CLI
# ------------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--stats", action="store_true", help="print counts per category and a few samples")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--samples", type=int, default=1, help="samples shown per category with --stats")
    ap.add_argument("--tokens", action="store_true", help="also count prompt tokens with the target's tokenizer")
    ap.add_argument("--check-eval", default=None, help="path of an eval question file to check for overlap")
    args = ap.parse_args(argv)
    prompts = training_prompts(args.seed)
    counts = Counter(p["category"] for p in prompts)
    words = [len(prompt_text(p).split()) for p in prompts]
    print(f"{len(prompts)} prompts, {len(stdlib_passages())} stdlib passages, "
          f"words per prompt: mean {statistics.mean(words):.0f}, max {max(words)}")
    for cat, n in counts.items():
        multi = sum(1 for p in prompts if p["category"] == cat and len(p["messages"]) > 1)
        print(f"  {cat:15s} {n:5d}  ({100 * n / len(prompts):4.1f}%){'  multi-turn: ' + str(multi) if multi else ''}")
    if args.tokens:
        from transformers import AutoTokenizer

        from core.target import smollm2_location

        folder, gguf = smollm2_location()
        tok = AutoTokenizer.from_pretrained(folder, gguf_file=gguf)
        lens = [len(tok.apply_chat_template(p["messages"], add_generation_prompt=True, tokenize=True)["input_ids"])
                for p in prompts]
        print(f"chat tokens per prompt: mean {statistics.mean(lens):.0f}, median {statistics.median(lens):.0f}, "
              f"max {max(lens)}, over 600: {sum(1 for x in lens if x > 600)}, total {sum(lens)}")
    if args.stats:
        rng = random.Random(args.seed)
        for cat in counts:
            pool = [p for p in prompts if p["category"] == cat]
            for p in rng.sample(pool, min(args.samples, len(pool))):
                print(f"\n--- {p['prompt_id']}")
                for m in p["messages"]:
                    print(f"[{m['role']}] {m['content'][:600]}")
    if args.check_eval:
        assert_disjoint(prompts, args.check_eval)
        print(f"{args.check_eval}: disjoint from the training prompts")


if __name__ == "__main__":
    main()
