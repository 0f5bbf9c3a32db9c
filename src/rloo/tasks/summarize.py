"""``summarize``: a synthetic stand-in for Reddit TL;DR summarization.

Prompt: ``"post : <6-12 words> tl;dr :"``. A post mixes 2-4 distinct KEY words (content: events,
people, things; 24 of them) with FILLER words (so, like, um, ...; 12 of them). Every key word has
an importance weight 1, 2 or 3 fixed by the table below (life events 3, people 2, small things 1).
The sizes are chosen for learnability: copying key words out of the post is what a tiny model
finds hardest, and with 40 key words and posts of up to 14 words a ~0.7M-parameter Llama
learned it noticeably slower in the same number of SFT steps.

A good summary lists the post's key words, in post order, and nothing else:

    post : so landlord um rent honestly like dog today tl;dr :
    -> landlord rent dog                          (ideal; gold 1.0)
    -> landlord rent                              (dropped dog, weight 1: gold 0.6)
    -> so landlord rent dog dog                   (filler and a repeat: gold 0.65)

Gold score (see ``gold_score``): ``2 * weighted_recall - 1`` minus penalties for each filler word,
each word not in the post (hallucination), each repeated word and each word beyond the length
budget. Ideal = 1, empty = -1; it works on any string.

References are drawn by ``sample_reference``: about a fifth are ideal; the rest drop key words
(low-importance ones more often, but not only), insert filler, and now and then hallucinate a key
word or repeat one, with a random severity per reference. An SFT model imitating them learns the
format but also their flaws; a reward model can learn from preferences that filler, omissions of
heavy words and hallucinations are bad, and RL can push the policy towards the ideal summary.
"""

from __future__ import annotations

import random

from rloo.tasks.base import SyntheticTask, stable_hash

# Importance tiers of key words: weight 3 (life events), 2 (people, places), 1 (small things).
KEY_WEIGHTS: dict[str, int] = {
    **dict.fromkeys("breakup divorce job fired loan debt lawsuit wedding".split(), 3),
    **dict.fromkeys("landlord rent exam boss sister girlfriend roommate car".split(), 2),
    **dict.fromkeys("dog cat party phone laptop gym weekend vacation".split(), 1),
}
KEY_WORDS: tuple[str, ...] = tuple(KEY_WEIGHTS)
FILLER_WORDS: tuple[str, ...] = tuple(
    "so like really today um just honestly basically actually anyway well okay".split()
)
SCAFFOLD: tuple[str, ...] = ("post", ":", "tl;dr")

MIN_POST_WORDS, MAX_POST_WORDS = 6, 12
MIN_KEYS, MAX_KEYS = 2, 4
EVAL_BUCKETS = 10  # a post is held out for eval when stable_hash(post) % EVAL_BUCKETS == 0

# Gold-score penalties, per offending word.
FILLER_PENALTY = 0.15
HALLUCINATION_PENALTY = 0.3
REPEAT_PENALTY = 0.2
LENGTH_PENALTY = 0.1
LENGTH_SLACK = 2  # words allowed beyond the number of key words before the length penalty

# Reference generator.
P_CLEAN = 0.1  # drawn ideal outright; flawed draws can also come out ideal by chance
DROP_BY_WEIGHT = {1: 0.6, 2: 0.35, 3: 0.15}  # drop probability at full severity
P_HALLUCINATE = 0.25  # at full severity
P_REPEAT = 0.1
MIN_SEVERITY = 0.2  # severity of a flawed reference is uniform in [MIN_SEVERITY, 1]


def post_words(prompt: str) -> list[str]:
    """The post inside a prompt: its words minus the ``post :`` / ``tl;dr :`` scaffold."""
    return [w for w in prompt.split() if w not in SCAFFOLD]


def post_keys(prompt: str) -> list[str]:
    """Distinct key words of the post, in post order."""
    return list(dict.fromkeys(w for w in post_words(prompt) if w in KEY_WEIGHTS))


class SummarizeTask(SyntheticTask):
    """Summarize a short post by listing its key words (Reddit TL;DR stand-in)."""

    name = "summarize"
    max_prompt_words = len(SCAFFOLD) + 1 + MAX_POST_WORDS  # "post :" + post + "tl;dr :"
    max_response_words = 12

    def sample_prompt(self, rng: random.Random, held_out: bool) -> str:
        while True:
            n_words = rng.randint(MIN_POST_WORDS, MAX_POST_WORDS)
            n_keys = rng.randint(MIN_KEYS, MAX_KEYS)
            words = rng.sample(KEY_WORDS, n_keys)
            words += [rng.choice(FILLER_WORDS) for _ in range(n_words - n_keys)]
            rng.shuffle(words)
            post = " ".join(words)
            if (stable_hash(post) % EVAL_BUCKETS == 0) == held_out:
                return f"post : {post} tl;dr :"

    def ideal_response(self, prompt: str) -> str:
        return " ".join(post_keys(prompt))

    def sample_reference(self, prompt: str, rng: random.Random) -> str:
        keys = post_keys(prompt)
        if rng.random() < P_CLEAN or not keys:
            return " ".join(keys)
        severity = MIN_SEVERITY + (1.0 - MIN_SEVERITY) * rng.random()
        kept = [k for k in keys if rng.random() >= severity * DROP_BY_WEIGHT[KEY_WEIGHTS[k]]]
        if not kept:  # a human summary says at least something
            kept = [rng.choice(keys)]
        words = list(kept)
        if rng.random() < P_REPEAT:
            i = rng.randrange(len(words))
            words.insert(i, words[i])
        if rng.random() < severity * P_HALLUCINATE:
            absent = [k for k in KEY_WORDS if k not in keys]
            words.insert(rng.randint(0, len(words)), rng.choice(absent))
        post_fillers = [w for w in post_words(prompt) if w in FILLER_WORDS] or list(FILLER_WORDS)
        for _ in range(sum(rng.random() < severity * 0.6 for _ in range(3))):
            filler = rng.choice(post_fillers if rng.random() < 0.7 else FILLER_WORDS)
            words.insert(rng.randint(0, len(words)), filler)
        return " ".join(words[: self.max_response_words])

    def gold_score(self, prompt: str, response: str) -> float:
        """``2 * weighted_recall - 1 - penalties``; 1 for the ideal summary, -1 for an empty one.

        weighted_recall: total weight of the post's key words the response mentions over the
        total weight of the post's key words (1 if the post has none). Penalties, per word:
        filler, anything not in the post (hallucination), each repeat of an earlier word, and
        each word beyond ``len(keys) + LENGTH_SLACK``. Word order is not scored.
        """
        keys = post_keys(prompt)
        in_post = set(post_words(prompt))
        words = response.split()
        total = sum(KEY_WEIGHTS[k] for k in keys)
        said = set(words)
        recall = sum(KEY_WEIGHTS[k] for k in keys if k in said) / total if total else 1.0
        n_filler = sum(w in FILLER_WORDS for w in words)
        n_halluc = sum(w not in in_post and w not in FILLER_WORDS for w in words)
        n_repeat = len(words) - len(said)
        n_long = max(0, len(words) - len(keys) - LENGTH_SLACK)
        return (
            2.0 * recall
            - 1.0
            - FILLER_PENALTY * n_filler
            - HALLUCINATION_PENALTY * n_halluc
            - REPEAT_PENALTY * n_repeat
            - LENGTH_PENALTY * n_long
        )

    def words(self) -> list[str]:
        return list(dict.fromkeys([*SCAFFOLD, *KEY_WORDS, *FILLER_WORDS]))
