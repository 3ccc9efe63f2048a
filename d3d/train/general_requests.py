"""General chat requests (writing, advice, explanations, reasoning, role play, arithmetic): the prose a chat
drafter meets beside code, which the function requests of ``chat_data`` never ask for.

The drafter trained on answers about functions drafts MT-Bench-like prose poorly (τ alone ~1.0-1.2 where it
reaches ~1.9 on code): none of its answers were general prose. These requests are built from templates and
topic lists written for d3d; none shares a topic or a run of five words with an MT-Bench question
(``tests/test_general_requests.py`` checks both against hashes of MT-Bench's n-grams,
``data/mtbench-ngrams.txt.xz``), so the MT-Bench sets that choices and reports are made on stay unseen.
"""

from __future__ import annotations

import hashlib
import lzma
import random
import re
from pathlib import Path

from ..files import atomic

TEMPLATES = (
    # writing
    "Write a short story about {person} who finds {object} in {place}.",
    "Write a poem of three short stanzas about {nature}.",
    "Write a friendly letter to {person} describing a weekend spent {activity}.",
    "Write a product description for {object}, aimed at people who enjoy {activity}.",
    "Write a short speech for {event}.",
    "Write a diary entry from the point of view of {person} after a long day.",
    # advice
    "What are some practical tips for {activity}?",
    "I want to get better at {activity}. Can you suggest a plan for the next month?",
    "How should I prepare for {event}?",
    "My friend is nervous about {event}. What could I say to encourage them?",
    "What are common mistakes beginners make when {activity}, and how can they be avoided?",
    # explanations
    "Explain {concept} to a ten-year-old.",
    "Explain how {concept} works, with an everyday example.",
    "Why is {concept} important? Answer in a few paragraphs.",
    "What is the history of {invention}? Give a short overview.",
    "How does {invention} work? Explain it simply.",
    "Describe the life cycle of {creature}.",
    "What would happen if {nature} disappeared from the Earth?",
    # comparison and opinion
    "Compare {activity} and {activity2}: which is better for relaxing after work, and why?",
    "What are the advantages and disadvantages of living in {place}?",
    "Is it better to learn {skill} from books or from a teacher? Give arguments for both sides.",
    # role play
    "Pretend you are {person}. Introduce yourself and describe what you do every morning.",
    "You are a tour guide in {place}. Welcome a group of visitors and tell them what they will see.",
    "Act as a coach for someone learning {skill}. Give them their first lesson.",
    # reasoning and arithmetic
    "A shop sells {things} at {price} dollars each. If I buy {n} of them and pay with a {bill} dollar note, how much "
    "change do I get? Show your steps.",
    "A train leaves at {hour}:00 and travels {km} kilometres at {speed} kilometres per hour. When does it arrive? "
    "Explain your reasoning.",
    "There are {n} {things} in a box and {k} of them are broken. What fraction of them still work? Simplify it.",
    "If {n} friends share {total} {things} equally, how many does each get, and how many are left over?",
)

PEOPLE = ("a retired lighthouse keeper", "a young beekeeper", "a night-shift nurse", "a village baker",
          "a clockmaker", "a shy violinist", "a mountain rescue volunteer", "a school librarian", "a fisherman",
          "a street musician", "a museum guard", "a forest ranger", "a tailor", "a beginner chess player",
          "a marathon runner", "a botanist", "a taxi driver", "a puppeteer", "a glassblower", "a farmer's daughter",
          "an old sailor", "a zookeeper", "a weaver", "a wildlife photographer", "a ferry captain",
          "a bicycle courier", "a train conductor", "a circus acrobat", "a cartographer", "a locksmith")
PLACES = ("a small fishing village", "a desert oasis", "a snowy mountain cabin", "an old train station",
          "a floating market", "a lighthouse on a cliff", "a quiet library", "a busy airport", "a jungle camp",
          "a wind farm", "an island with no cars", "a forgotten greenhouse", "an underground cave",
          "a lakeside campsite", "a medieval castle", "a harbour town", "a vineyard", "a night bus",
          "a research station in the Arctic", "a rooftop garden", "a ghost town", "a canal boat",
          "a mountain monastery", "a seaside pier", "a salt flat")
OBJECTS = ("a brass compass", "an umbrella that never gets wet", "a pocket watch", "a paper lantern",
           "a wooden chess set", "a map with no names", "a jar of buttons", "a music box", "a red bicycle",
           "a telescope", "a sealed envelope", "a handmade quilt", "a key with no lock", "a cracked mirror",
           "a tin of old photographs", "a kite", "a typewriter", "a ceramic teapot", "a pair of hiking boots",
           "a sourdough starter")
NATURE = ("the tide", "autumn leaves", "a thunderstorm", "fireflies", "the first snow", "a river delta", "moss",
          "the northern lights", "coral reefs", "a meadow at dawn", "migrating geese", "fog over a valley",
          "sand dunes", "bamboo forests", "glaciers", "wildflowers", "honeybees", "the night sky")
ACTIVITIES = ("gardening on a balcony", "baking bread at home", "running a first half marathon",
              "learning to draw portraits", "keeping a journal", "birdwatching", "cycling to work",
              "hiking in the rain", "growing tomatoes", "swimming in open water", "knitting a scarf",
              "planning a road trip", "camping with children", "saving money on groceries", "studying for exams",
              "practising yoga", "cooking for a large family", "learning a new language", "rock climbing",
              "restoring old furniture", "making pottery", "playing chess online", "fishing in a lake",
              "sailing a small boat", "composting kitchen waste")
EVENTS = ("a first job interview", "a school reunion", "a wedding toast for a sister", "a charity bake sale",
          "moving to a new country", "a driving test", "a retirement party for a colleague", "a science fair",
          "a spelling bee", "a long flight with a baby", "a piano recital", "the first day at university",
          "a neighbourhood clean-up day", "a family camping trip", "a team's end-of-season dinner")
CONCEPTS = ("compound interest", "the water cycle", "how vaccines train the immune system", "lightning",
            "gravity", "how rainbows form", "recycling", "tides and the moon", "the food chain", "electricity",
            "how bees make honey", "erosion", "the seasons", "how airplanes stay in the air", "democracy",
            "sleep and memory", "how compasses work", "sound waves", "volcanic eruptions", "a balanced diet",
            "the greenhouse effect", "how muscles grow", "friction", "budgeting", "evaporation")
INVENTIONS = ("the printing press", "the bicycle", "the refrigerator", "the telephone", "the light bulb",
              "the microwave oven", "the steam engine", "the pencil", "the radio", "the washing machine",
              "the compass", "the elevator", "the zipper", "the thermometer", "paper money")
CREATURES = ("a frog", "a butterfly", "a salmon", "a sunflower", "a honeybee", "a sea turtle", "an oak tree",
             "a mosquito", "a penguin", "a ladybird")
SKILLS = ("the guitar", "watercolour painting", "touch typing", "knot tying", "swimming", "juggling",
          "calligraphy", "sign language", "woodworking", "archery", "chess", "sewing")
THINGS = ("pears", "notebooks", "pencils", "light bulbs", "eggs", "marbles", "candles", "tickets", "cups",
          "stamps")
SLOTS = {"person": PEOPLE, "place": PLACES, "object": OBJECTS, "nature": NATURE, "activity": ACTIVITIES,
         "activity2": ACTIVITIES, "event": EVENTS, "concept": CONCEPTS, "invention": INVENTIONS,
         "creature": CREATURES, "skill": SKILLS, "things": THINGS}


def general_request(rng: random.Random) -> str:
    """One request: a template with its slots filled from ``rng``."""
    template = rng.choice(TEMPLATES)
    values = {k: rng.choice(v) for k, v in SLOTS.items()}
    while values["activity2"] == values["activity"]:
        values["activity2"] = rng.choice(ACTIVITIES)
    n = rng.randint(3, 24)
    values |= {"n": n, "k": rng.randint(1, n - 1), "price": rng.randint(2, 15), "bill": rng.choice((50, 100, 200)),
               "hour": rng.randint(6, 20), "km": rng.choice((60, 90, 120, 150, 180, 240, 300)),
               "speed": rng.choice((30, 60, 90, 120)), "total": rng.randint(20, 90)}
    return template.format(**values)


def general_requests(n: int, seed: int = 0) -> list[list[dict]]:
    """The first ``n`` distinct general requests of the stream ``seed``, each as chat messages. The first
    requests never depend on ``n``, so a store grows by the requests after those it holds."""
    rng, seen, out = random.Random(seed), set(), []
    tries = 0
    while len(out) < n:
        text = general_request(rng)
        tries += 1
        if tries > 50 * n + 1000:
            raise ValueError(f"general_requests: only {len(out)} distinct requests of the {n} asked")
        if text not in seen:
            seen.add(text)
            out.append([{"role": "user", "content": text}])
    return out


# ---------------------------------------------------------------- disjoint from MT-Bench

NGRAMS = Path(__file__).resolve().parents[2] / "data" / "mtbench-ngrams.txt.xz"  # in a source checkout
LONGEST = 6  # word n-grams of 1..LONGEST words are hashed


def words(text: str) -> list[str]:
    """Lower-case words (letters, digits, apostrophes): what n-grams are made of."""
    return re.findall(r"[a-z0-9']+", text.lower())


def ngram_hash(ws: list[str]) -> str:
    """A 12-hex-digit hash of a word n-gram."""
    return hashlib.blake2b(" ".join(ws).encode(), digest_size=6).hexdigest()


def ngram_hashes(ws: list[str], n: int) -> set[str]:
    return {ngram_hash(ws[i:i + n]) for i in range(len(ws) - n + 1)}


def write_mtbench_ngrams(question_jsonl: Path, out: Path = NGRAMS) -> int:
    """Hash every word n-gram (1..LONGEST words) of both turns of every MT-Bench question into ``out``
    (xz, one hash a line, sorted); the number written. The questions stay out of the repository."""
    import json

    hashes = set()
    for line in Path(question_jsonl).read_text().splitlines():
        if line.strip():
            for turn in json.loads(line)["turns"]:
                ws = words(turn)
                for n in range(1, LONGEST + 1):
                    hashes |= ngram_hashes(ws, n)
    with atomic(out) as tmp:
        tmp.write_bytes(lzma.compress("\n".join(sorted(hashes)).encode()))
    return len(hashes)


def mtbench_ngrams(path: Path = NGRAMS) -> set[str]:
    """The committed hashes ``write_mtbench_ngrams`` wrote."""
    return set(lzma.decompress(Path(path).read_bytes()).decode().split())


__all__ = ["TEMPLATES", "SLOTS", "general_request", "general_requests", "words", "ngram_hash", "ngram_hashes",
           "write_mtbench_ngrams", "mtbench_ngrams"]


if __name__ == "__main__":  # python -m d3d.train.general_requests QUESTION_JSONL: the hashes again
    import sys

    print(f"{NGRAMS}: {write_mtbench_ngrams(Path(sys.argv[1]))} n-gram hashes")
