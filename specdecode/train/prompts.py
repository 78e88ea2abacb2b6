"""Chat prompts for self-distillation, written here: tasks about the given Python files (code, prose
about their documentation, roleplay, emails) and general-domain prompts from word lists, with
synthetic arithmetic. No benchmark prompt is used."""
from __future__ import annotations

import ast
import random
from pathlib import Path


_CODE_TEMPLATES = (
    "Explain what this Python function from the `{m}` module does:\n\n```python\n{s}\n```",
    "Write a Python function `{n}` that does the following: {d}",
    "What is `{m}.{n}` in the Python standard library used for? Give a short example.",
    "Add type hints and comments to this code and explain your changes:\n\n```python\n{s}\n```",
    "Write unit tests with pytest for this function:\n\n```python\n{s}\n```",
)
# Prose tasks over the same material, so that the head also sees the target's conversational answers.
_TEXT_TEMPLATES = (
    "In plain words, what does this sentence from Python's documentation mean? \"{d}\"",
    "Translate into {lang}: \"{d}\"",
    "Summarize the following text in two or three sentences:\n\n{doc}",
    "Read this text and list its three most important points:\n\n{doc}",
    "Write a short story (about 120 words) about a programmer who discovers the `{m}` module.",
    "Write a short poem about {topic}.",
    "You are a senior developer mentoring a junior colleague. Explain, in character, why `{m}.{n}` is useful.",
    "Write a polite email to a colleague proposing to use `{m}` in our project. Mention: {d}",
    "Give three pros and three cons of {topic}.",
)
_LANGS = ("French", "German", "Spanish", "Italian", "Chinese", "Japanese")


def _math_prompt(rng: random.Random) -> str:
    a, b, c = rng.randint(3, 60), rng.randint(2, 25), rng.randint(2, 9)
    return rng.choice((
        f"A shop sells notebooks for {b} dollars each. Anna buys {a} notebooks and pays with {a * b + c * 10} "
        f"dollars. How much change does she get? Explain step by step.",
        f"What is {a} times {b}, plus {c}? Show your reasoning.",
        f"A train travels {a * c} km in {c} hours. What is its average speed, and how far does it go in {b} hours?",
        f"Solve for x: {c}x + {a} = {c * b + a}. Explain each step.",
        f"If {a} workers build a wall in {b} days, how long would {a * 2} workers take? Explain your reasoning.",
    ))


def distill_prompts(files: list[Path], n: int, seed: int) -> list[str]:
    """n chat prompts written from the given Python files: code tasks about their functions, prose
    tasks about their documentation (explain, translate, summarize, stories, roleplay, emails) and
    synthetic arithmetic word problems."""
    rng = random.Random(seed)
    funcs: list[tuple[str, str, str, str]] = []  # (module, name, first doc line, source)
    docs: list[str] = []  # module docstrings, a paragraph or two
    for f in rng.sample(files, min(len(files), 2 * n + 20)):
        try:
            text = f.read_text(encoding="utf-8")
            tree = ast.parse(text)
        except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
            continue
        if ast.get_docstring(tree) and len(ast.get_docstring(tree)) > 200:
            docs.append(ast.get_docstring(tree)[:1200])
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and ast.get_docstring(node) and not node.name.startswith("_"):
                src = "\n".join((ast.get_source_segment(text, node) or "").splitlines()[:30])
                funcs.append((f.stem, node.name, ast.get_docstring(node).strip().splitlines()[0], src))
    if not funcs:
        return []
    out = []
    for _ in range(n):
        m, name, d, src = rng.choice(funcs)
        kind = rng.random()
        if kind < 0.15:
            out.append(_math_prompt(rng))
            continue
        template = rng.choice(_CODE_TEMPLATES if kind < 0.5 else _TEXT_TEMPLATES)
        topic = rng.choice((f"the Python module {m}", d.rstrip(".").lower(), f"writing {name.replace('_', ' ')} code"))
        out.append(template.format(m=m, n=name, d=d, s=src, lang=rng.choice(_LANGS), topic=topic,
                                   doc=rng.choice(docs) if docs else d))
    return out


# General-domain chat prompts (not about Python): so that a head also sees the target's answers on
# everyday subjects. Written here from word lists; no benchmark prompt is used.
_SUBJECTS = (
    "photosynthesis", "the French Revolution", "black holes", "climate change", "the human immune system",
    "inflation in economics", "the Roman Empire", "vaccines", "electric cars", "the stock market",
    "volcanoes", "the water cycle", "social media", "the Renaissance", "plate tectonics", "sleep",
    "renewable energy", "the printing press", "DNA", "the Olympic Games", "coffee", "honey bees",
    "the Great Wall of China", "jazz music", "remote work", "the Moon landing", "antibiotics",
    "machine learning", "recycling", "the Industrial Revolution", "earthquakes", "meditation",
    "the Amazon rainforest", "cryptocurrency", "the Silk Road", "chess", "nuclear power", "tea ceremonies",
    "public libraries", "urban gardening", "the ozone layer", "marathon training", "ancient Egypt",
)
_PLACES = ("Hawaii", "Kyoto", "Iceland", "Peru", "Morocco", "New Zealand", "Lisbon", "the Alps", "Vietnam",
           "Cape Town", "Scotland", "Istanbul")
_GENERAL_TEMPLATES = (
    "Explain {s} to a ten-year-old.",
    "What are the main causes and effects of {s}?",
    "Give me five interesting facts about {s}.",
    "Write a short blog post about {s}.",
    "Compare {s} and {t}: how are they similar and how are they different?",
    "Write an outline for a presentation about {s}, with headings and key points.",
    "Write a persuasive paragraph arguing that schools should teach more about {s}.",
    "What is the history of {s}? Answer in a few paragraphs.",
    "Write a professional email to your manager proposing a workshop on {s}. Keep it short.",
    "Compose an engaging travel blog post about a trip to {p}, with cultural experiences and must-see places.",
    "Plan a three-day itinerary for a visit to {p}.",
    "Pretend you are a tour guide in {p}. Welcome a group of visitors and describe what they will see.",
    "Describe a vivid character who is an expert on {s}, in one paragraph.",
    "Write a short story set in {p} that involves {s}.",
    "What are common misconceptions about {s}?",
    "Answer briefly: who first studied {s}, and why does it matter today?",
    "Summarize the debate about {s} in three sentences.",
    "Give step-by-step advice for a beginner who wants to learn about {s}.",
)
_SENTENCES = (
    "I would like to book a table for two at seven o'clock.", "The museum is closed on Mondays.",
    "Could you tell me how to get to the train station?", "We have been working on this project for three months.",
    "The weather will be sunny tomorrow, with a light breeze in the afternoon.",
    "Please remember to turn off the lights when you leave the office.",
    "My grandmother grew up in a small village near the sea.", "The meeting has been moved to Thursday morning.",
    "Reading before bed helps me relax.", "The new library opens next week and everyone is invited.",
)


def general_prompts(n: int, seed: int) -> list[str]:
    """n distinct general-domain chat prompts: explanations, comparisons, essays, emails, stories,
    travel plans, roleplay, translations of everyday sentences and arithmetic word problems."""
    rng = random.Random(seed)
    out: dict[str, None] = {}  # insertion-ordered set
    for _ in range(20 * n):
        if len(out) >= n:
            break
        kind = rng.random()
        if kind < 0.1:
            p = _math_prompt(rng)
        elif kind < 0.2:
            p = f"Translate into {rng.choice(_LANGS)}: \"{rng.choice(_SENTENCES)}\""
        else:
            s, t = rng.sample(_SUBJECTS, 2)
            p = rng.choice(_GENERAL_TEMPLATES).format(s=s, t=t, p=rng.choice(_PLACES))
        out[p] = None
    return list(out)
