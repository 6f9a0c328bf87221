"""Tasks of posenc_cli.data, checked against plain-Python recomputations of each task."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from torch import nn

from posenc_cli.data import IGNORE, TASKS, Batch, Score, Task, build_task, score
from posenc_cli.data import text as text_module
from posenc_cli.data.batch import curriculum_largest
from posenc_cli.errors import UsageError

ALGORITHMIC = [
    "copy",
    "reverse",
    "sort",
    "recall",
    "addition",
    "summation",
    "parity",
    "summation-scratchpad",
    "parity-scratchpad",
]
PAD, BOS, SEP, EOS = 0, 1, 2, 3


@dataclass(frozen=True)
class Cfg:
    """Stands in for config.DataConfig: build_task only reads these attributes."""

    task: str = "copy"
    vocab: int = 10
    train_lengths: list[int] = field(default_factory=lambda: [2, 6])
    corpus: str | None = None
    val_fraction: float = 0.1
    ones: str = "binomial"


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def same(a: Batch, b: Batch) -> bool:
    masks = (a.key_mask is None and b.key_mask is None) or (
        a.key_mask is not None and b.key_mask is not None and torch.equal(a.key_mask, b.key_mask)
    )
    return torch.equal(a.tokens, b.tokens) and torch.equal(a.targets, b.targets) and masks


@pytest.fixture
def corpus_file(tmp_path: Path) -> Path:
    path = tmp_path / "corpus.txt"
    path.write_text(
        "the quick brown fox jumps over the lazy dog.\n" * 40 + "END!", encoding="utf-8"
    )
    return path


def every_task(corpus: Path) -> list[Task]:
    tasks = [build_task(Cfg(task=name)) for name in [*ALGORITHMIC, "word-order"]]
    return [*tasks, build_task(Cfg(task="text", corpus=str(corpus)))]


def split_row(row: list[int]) -> tuple[list[int], list[int], int]:
    """Plain decoding of ``[BOS] input [SEP] output [EOS] PAD*``: (input, output, real length)."""
    assert row[0] == BOS and row.count(SEP) == 1 and row.count(EOS) == 1
    sep, eos = row.index(SEP), row.index(EOS)
    assert sep < eos and all(t == PAD for t in row[eos + 1 :])
    assert PAD not in row[: eos + 1]
    return row[1:sep], row[sep + 1 : eos], eos + 1


# --- registry and duck-typed config -------------------------------------------------------


def test_registry_names_and_protocol(corpus_file: Path) -> None:
    assert set(TASKS) == {*ALGORITHMIC, "addition-hints", "word-order", "text"}
    for task in every_task(corpus_file):
        assert isinstance(task, Task)
        assert task.kind in ("lm", "classify")
        assert task.num_classes == (2 if task.kind == "classify" else 0)


def test_unknown_task_names_key_and_close_match() -> None:
    with pytest.raises(UsageError, match=r"data\.task.*'cpy'.*did you mean 'copy'"):
        build_task(Cfg(task="cpy"))


@pytest.mark.parametrize(
    ("cfg", "key"),
    [
        (Cfg(train_lengths=[6, 2]), "data.train_lengths"),
        (Cfg(train_lengths=[0, 3]), "data.train_lengths"),
        (Cfg(train_lengths=[3]), "data.train_lengths"),
        (Cfg(task="word-order", train_lengths=[1, 3]), "data.train_lengths"),
        (Cfg(vocab=1), "data.vocab"),
        (Cfg(task="recall", vocab=4, train_lengths=[2, 5]), "data.vocab"),
        (Cfg(task="text", val_fraction=1.0), "data.val_fraction"),
    ],
)
def test_bad_config_values_name_the_key(cfg: Cfg, key: str) -> None:
    with pytest.raises(UsageError, match=key.replace(".", r"\.")) as err:
        build_task(cfg)
    assert "\n" not in str(err.value)


# --- every task: determinism, shapes, dtypes ----------------------------------------------


@pytest.mark.parametrize("split", ["train", "test"])
def test_same_seed_same_batch_and_global_rng_untouched(corpus_file: Path, split: str) -> None:
    for task in every_task(corpus_file):
        state = torch.get_rng_state()
        first = task.batch(16, 5, gen(3), split)
        assert torch.equal(torch.get_rng_state(), state), task
        assert same(first, task.batch(16, 5, gen(3), split)), task
        assert not same(first, task.batch(16, 5, gen(4), split)), task


@pytest.mark.parametrize("split", ["train", "test"])
def test_shapes_dtypes_and_token_range(corpus_file: Path, split: str) -> None:
    for task in every_task(corpus_file):
        b = task.batch(7, 5, gen(), split)
        assert b.tokens.dtype == torch.long and b.targets.dtype == torch.long
        assert b.tokens.dim() == 2 and b.tokens.shape[0] == 7
        assert 0 <= int(b.tokens.min()) and int(b.tokens.max()) < task.vocab_size
        if task.kind == "lm":
            assert b.targets.shape == b.tokens.shape
            real = b.targets[b.targets != IGNORE]
            assert 0 <= int(real.min()) and int(real.max()) < task.vocab_size
        else:
            assert b.targets.shape == (7,)
            assert set(b.targets.tolist()) <= set(range(task.num_classes))
        if b.key_mask is not None:
            assert b.key_mask.dtype == torch.bool and b.key_mask.shape == b.tokens.shape


def test_batch_moves_to_device() -> None:
    b = build_task(Cfg()).batch(4, 3, gen(), "train").to("cpu")
    assert b.tokens.device.type == "cpu" and b.key_mask is not None


# --- algorithmic tasks --------------------------------------------------------------------


@pytest.mark.parametrize("name", ALGORITHMIC)
@pytest.mark.parametrize("split", ["train", "test"])
def test_targets_are_next_tokens_on_the_output_span_only(name: str, split: str) -> None:
    task = build_task(Cfg(task=name))
    b = task.batch(32, 4, gen(1), split)
    for row, tgt in zip(b.tokens.tolist(), b.targets.tolist(), strict=True):
        _, out, _ = split_row(row)
        sep = row.index(SEP)
        for t, target in enumerate(tgt):
            if sep <= t < sep + len(out) + 1:  # SEP .. last output token predict outputs + EOS
                assert target == row[t + 1]
            else:
                assert target == IGNORE


@pytest.mark.parametrize("name", ALGORITHMIC)
def test_layout_matches_the_sequences(name: str) -> None:
    task = build_task(Cfg(task=name))
    for n in (1, 3, 7):
        b = task.batch(4, n, gen(n), "test")
        lay = task.layout(n)
        assert b.tokens.shape[1] == lay.length
        scored = (b.targets != IGNORE).nonzero()[:, 1].unique().tolist()
        assert scored == list(range(lay.length))[lay.targets]
        assert (b.tokens[:, lay.sep] == SEP).all() and (b.tokens[:, -1] == EOS).all()
        assert b.tokens[:, lay.output].shape[1] == lay.output_len


def check_problem(name: str, inp: list[int], out: list[int], vocab: int, offset: int) -> int:
    """Recompute the answer in plain Python; returns the problem size n."""
    sym = [t - offset for t in inp]
    ans = [t - offset for t in out]
    if name == "copy":
        assert ans == sym
    elif name == "reverse":
        assert ans == sym[::-1]
    elif name == "sort":
        assert ans == sorted(sym)
    elif name == "recall":
        keys, values, query = sym[0:-1:2], sym[1:-1:2], sym[-1]
        assert len(set(keys)) == len(keys) and query in keys
        assert ans == [values[keys.index(query)]]
        return len(keys)
    elif name == "addition":
        plus = inp.index(4)  # PLUS
        a, b = sym[:plus], sym[plus + 1 :]
        assert len(a) == len(b) and len(ans) == len(a) + 1

        def value(digits: list[int]) -> int:  # least significant digit first
            return sum(d * vocab**i for i, d in enumerate(digits))

        assert value(ans) == value(a) + value(b)
        assert all(0 <= d < vocab for d in a + b + ans)
        return len(a)
    elif name.startswith(("summation", "parity")):
        base = 2 if name.startswith("parity") else vocab
        assert all(0 <= d < base for d in sym)
        running, total = [], 0
        for d in sym:
            total += d
            running.append(total % base)
        # the scratchpad writes every running sum; the one-token task only the last
        assert ans == (running if name.endswith("scratchpad") else running[-1:])
        return len(sym)
    assert all(0 <= s < vocab for s in sym + ans)
    return len(sym)


@pytest.mark.parametrize("name", ALGORITHMIC)
@pytest.mark.parametrize("vocab", [10, 16])
def test_outputs_are_correct_and_sizes_respected(name: str, vocab: int) -> None:
    task = build_task(Cfg(task=name, vocab=vocab, train_lengths=[2, 6]))
    offset = 5 if name == "addition" else 4
    vocab = 2 if name.startswith("parity") else vocab  # parity: bits, whatever vocab says
    assert task.vocab_size == offset + vocab
    sizes = []
    for seed in range(4):
        b = task.batch(32, 0, gen(seed), "train")
        for row in b.tokens.tolist():
            inp, out, _ = split_row(row)
            sizes.append(check_problem(name, inp, out, vocab, offset))
    assert set(sizes) == {2, 3, 4, 5, 6}  # every size of the inclusive range, nothing else
    b = task.batch(8, 9, gen(), "test")
    for row in b.tokens.tolist():
        inp, out, _ = split_row(row)
        assert check_problem(name, inp, out, vocab, offset) == 9


@pytest.mark.parametrize(
    "name", ["summation", "parity", "summation-scratchpad", "parity-scratchpad"]
)
def test_answers_take_every_value(name: str) -> None:
    """Both answers occur for parity, all ten residues for summation: not a constant output."""
    task = build_task(Cfg(task=name, vocab=10))
    b = task.batch(512, 7, gen(), "test")
    answers = set((b.tokens[:, -2] - 4).tolist())  # the last output token, before EOS
    assert answers == set(range(2 if name.startswith("parity") else 10))


@pytest.mark.parametrize("name", ["summation", "parity"])
def test_a_scratchpad_ends_in_the_one_token_answer(name: str) -> None:
    """Same seed, same inputs: the scratchpad's last step is the one-token task's answer, and
    it scores n outputs (plus EOS) where the one-token task scores one."""
    short = build_task(Cfg(task=name)).batch(64, 9, gen(3), "test")
    pad = build_task(Cfg(task=f"{name}-scratchpad")).batch(64, 9, gen(3), "test")
    assert torch.equal(short.tokens[:, :11], pad.tokens[:, :11])  # BOS, 9 digits, SEP
    assert torch.equal(short.tokens[:, -2], pad.tokens[:, -2])
    assert ((short.targets != IGNORE).sum(1) == 2).all()
    assert ((pad.targets != IGNORE).sum(1) == 10).all()


def test_addition_produces_carries_and_leading_zeros() -> None:
    task = build_task(Cfg(task="addition", vocab=10))
    b = task.batch(256, 3, gen(), "test")
    top = b.tokens[:, -2] - 5  # last output digit = the final carry
    lead_a = b.tokens[:, 3] - 5  # most significant digit of a (positions: BOS a0 a1 a2)
    assert set(top.tolist()) == {0, 1} and (lead_a == 0).any()


# --- addition with index hints -------------------------------------------------------------

HINT0, HINTS = 5, 64  # first hint id (after PAD, BOS, SEP, EOS, PLUS) and how many there are


def read_hinted(tokens: list[int]) -> tuple[list[int], list[int], list[int], list[int]]:
    """Plain decoding of ``h a h a ... + h b ... SEP h c ...``: hints and digits of a, b, sum."""
    inp, out, _ = split_row(tokens)
    plus = inp.index(4)
    a, b = inp[:plus], inp[plus + 1 :]
    hints = [a[0::2], b[0::2], out[0::2]]
    assert hints[0] == hints[1] == hints[2][:-1]
    assert hints[2] == list(range(hints[2][0], hints[2][0] + len(hints[2])))  # consecutive
    assert all(HINT0 <= h < HINT0 + HINTS for h in hints[2])
    digits = [[t - HINT0 - HINTS for t in part[1::2]] for part in (a, b, out)]
    return hints[2], *digits


def test_addition_hints_sum_and_hints_recomputed() -> None:
    task = build_task(Cfg(task="addition-hints", vocab=10, train_lengths=[1, 20]))
    assert task.vocab_size == HINT0 + HINTS + 10
    for n in (1, 7, 20, 40):
        for row in task.batch(64, n, gen(n), "test").tokens.tolist():
            _, a, b, total = read_hinted(row)
            assert len(a) == len(b) == n and len(total) == n + 1
            assert all(0 <= d < 10 for d in a + b + total)
            value = lambda ds: sum(d * 10**i for i, d in enumerate(ds))  # noqa: E731
            assert value(total) == value(a) + value(b)


def test_addition_hints_scores_the_digits_and_the_end_only() -> None:
    task = build_task(Cfg(task="addition-hints", train_lengths=[1, 20]))
    b = task.batch(32, 0, gen(1), "train")
    for row, tgt in zip(b.tokens.tolist(), b.targets.tolist(), strict=True):
        _, out, end = split_row(row)
        sep = row.index(SEP)
        for t, target in enumerate(tgt):
            # the position before each digit of the sum, and the last digit's (EOS next)
            answered = sep < t < end - 1 and (t - sep) % 2 == 1 or t == end - 2
            assert target == (row[t + 1] if answered else IGNORE), (t, row)
        assert sum(x != IGNORE for x in tgt) == len(out) // 2 + 1


def test_addition_hints_digits_are_plain_additions_and_starts_vary() -> None:
    """Same seed: the digits are the plain task's (the hints are drawn after them); training
    rows start their hints all over the set, so every hint a size-40 test uses was trained."""
    hinted = build_task(Cfg(task="addition-hints", train_lengths=[1, 20]))
    plain = build_task(Cfg(task="addition", train_lengths=[1, 20]))
    for row, ref in zip(
        hinted.batch(16, 9, gen(2), "test").tokens.tolist(),
        plain.batch(16, 9, gen(2), "test").tokens.tolist(),
        strict=True,
    ):
        _, a, b, total = read_hinted(row)
        inp, out, _ = split_row(ref)
        assert [t - 5 for t in inp] == [*a, -1, *b] and [t - 5 for t in out] == total
    seen = set()
    for seed in range(8):
        for row in hinted.batch(64, 0, gen(seed), "train").tokens.tolist():
            seen |= set(read_hinted(row)[0])
    assert seen == set(range(HINT0, HINT0 + HINTS))


def test_addition_hints_size_beyond_the_hints_is_a_usage_error() -> None:
    task = build_task(Cfg(task="addition-hints", train_lengths=[1, 20]))
    task.batch(2, HINTS - 1, gen(), "test")
    with pytest.raises(UsageError, match=r"length: addition-hints has 64 hint symbols"):
        task.batch(2, HINTS, gen(), "test")
    with pytest.raises(UsageError, match=r"data\.train_lengths"):
        build_task(Cfg(task="addition-hints", train_lengths=[1, HINTS]))


@pytest.mark.parametrize("name", ALGORITHMIC)
def test_padding_and_key_mask(name: str) -> None:
    task = build_task(Cfg(task=name))
    b = task.batch(32, 0, gen(2), "train")
    assert b.key_mask is not None
    assert torch.equal(b.key_mask, b.tokens != PAD)
    assert (b.targets[~b.key_mask] == IGNORE).all()
    for row, mask in zip(b.tokens.tolist(), b.key_mask.tolist(), strict=True):
        _, _, real = split_row(row)
        assert mask == [True] * real + [False] * (len(row) - real)  # right padding only
    assert task.batch(8, 5, gen(), "test").key_mask is None  # one size: nothing padded


def test_recall_size_beyond_vocab_is_a_usage_error() -> None:
    task = build_task(Cfg(task="recall", vocab=8, train_lengths=[2, 8]))
    task.batch(2, 8, gen(), "test")
    with pytest.raises(UsageError, match=r"data\.vocab"):
        task.batch(2, 9, gen(), "test")


# --- word order ---------------------------------------------------------------------------


def test_word_order_labels_and_layout() -> None:
    task = build_task(Cfg(task="word-order", vocab=5, train_lengths=[2, 9]))
    assert task.vocab_size == 3 + 5
    b = task.batch(64, 0, gen(), "train")
    seen_lengths = set()
    for row, label, mask in zip(
        b.tokens.tolist(), b.targets.tolist(), b.key_mask.tolist(), strict=True
    ):
        real = [t for t, m in zip(row, mask, strict=True) if m]
        seen_lengths.add(len(real))
        assert real.count(1) == 1 and real.count(2) == 1 and PAD not in real
        assert all(t == PAD for t, m in zip(row, mask, strict=True) if not m)
        assert label == int(real.index(1) < real.index(2))
    assert min(seen_lengths) >= 2 and max(seen_lengths) <= 9 and len(seen_lengths) > 3
    fixed = task.batch(6, 7, gen(), "test")
    assert fixed.tokens.shape == (6, 7) and fixed.key_mask is None


@pytest.mark.parametrize("split", ["train", "test"])
def test_word_order_pairs_share_tokens_so_a_bag_model_is_exactly_at_chance(split: str) -> None:
    task = build_task(Cfg(task="word-order", vocab=6, train_lengths=[2, 12]))
    b = task.batch(64, 10, gen(5), split)
    assert int(b.targets.sum()) == 32  # exactly balanced
    for k in range(0, 64, 2):
        assert sorted(b.tokens[k].tolist()) == sorted(b.tokens[k + 1].tolist())
        assert b.targets[k] + b.targets[k + 1] == 1
    torch.manual_seed(0)
    bag = nn.EmbeddingBag(task.vocab_size, 8, mode="mean", padding_idx=PAD).double()
    head = nn.Linear(8, 2).double()  # a bag of tokens: no positions at all
    with torch.no_grad():
        logits = head(bag(b.tokens))  # (B, 2)
    # the pair is indistinguishable (up to float summation order)
    torch.testing.assert_close(logits[0::2], logits[1::2], atol=1e-12, rtol=1e-12)
    assert score(logits.argmax(-1), b.targets).token_accuracy == 0.5


def test_word_order_odd_batch() -> None:
    b = build_task(Cfg(task="word-order")).batch(5, 4, gen(), "test")
    assert b.tokens.shape == (5, 4) and b.targets.shape == (5,)


# --- text ---------------------------------------------------------------------------------


def test_text_split_is_the_tail_disjoint_and_deterministic(corpus_file: Path) -> None:
    text = corpus_file.read_text(encoding="utf-8")
    task = build_task(Cfg(task="text", corpus=str(corpus_file), val_fraction=0.25))
    train, val = task.stream("train"), task.stream("test")
    assert len(val) == round(len(text) * 0.25) and len(train) + len(val) == len(text)
    assert task.decode(train) == text[: len(train)] and task.decode(val) == text[len(train) :]
    again = build_task(Cfg(task="text", corpus=str(corpus_file), val_fraction=0.25))
    assert torch.equal(again.stream("train"), train) and torch.equal(again.stream("test"), val)


def test_text_vocabulary_covers_the_corpus(corpus_file: Path) -> None:
    text = corpus_file.read_text(encoding="utf-8")
    task = build_task(Cfg(task="text", corpus=str(corpus_file)))
    assert task.chars == "".join(sorted(set(text)))
    assert task.vocab_size == len(set(text)) + 1
    ids = torch.cat([task.stream("train"), task.stream("test")])
    assert int(ids.max()) < task.unknown_id  # no corpus character is unknown
    assert [task.chars.index(c) for c in text] == ids.tolist()
    assert task.encode("fox\u00e9").tolist() == [
        *[task.chars.index(c) for c in "fox"],
        task.unknown_id,
    ]


def test_text_batches_are_windows_of_the_split(corpus_file: Path) -> None:
    task = build_task(Cfg(task="text", corpus=str(corpus_file), val_fraction=0.5))
    for split in ("train", "test"):
        source = task.decode(task.stream(split))
        b = task.batch(8, 12, gen(), split)
        assert b.tokens.shape == (8, 12) and b.key_mask is None
        assert torch.equal(b.targets[:, :-1], b.tokens[:, 1:])
        for row, tgt in zip(b.tokens, b.targets, strict=True):
            assert task.decode(torch.cat([row, tgt[-1:]])) in source
    with pytest.raises(UsageError, match="length"):
        task.batch(2, len(task.stream("test")), gen(), "test")


def test_text_folder_corpus_sorted_and_filtered(tmp_path: Path) -> None:
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "z.md").write_text("ZZZZ", encoding="utf-8")
    (tmp_path / "a.txt").write_text("aaaa", encoding="utf-8")
    (tmp_path / "c.py").write_text("cccc", encoding="utf-8")
    (tmp_path / "skip.bin").write_text("????", encoding="utf-8")
    task = build_task(Cfg(task="text", corpus=str(tmp_path), val_fraction=0.25))
    whole = task.decode(torch.cat([task.stream("train"), task.stream("test")]))
    assert whole == "aaaaZZZZcccc"  # a.txt, b/z.md, c.py by relative path; .bin ignored


def test_text_missing_or_empty_corpus_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"data\.corpus.*no such file") as err:
        build_task(Cfg(task="text", corpus=str(tmp_path / "nope.txt")))
    assert "\n" not in str(err.value)
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "x.bin").write_text("data", encoding="utf-8")
    with pytest.raises(UsageError, match=r"data\.corpus.*no text"):
        build_task(Cfg(task="text", corpus=str(tmp_path / "empty")))
    (tmp_path / "e.txt").write_text("", encoding="utf-8")
    with pytest.raises(UsageError, match=r"data\.corpus.*no text"):
        build_task(Cfg(task="text", corpus=str(tmp_path / "e.txt")))


def test_default_corpus_is_the_stdlib_built_once() -> None:
    start = time.perf_counter()
    task = build_task(Cfg(task="text"))
    assert time.perf_counter() - start < 5  # generous for slow machines; about 0.5 s here
    assert task.vocab_size > 80  # source code: letters, digits, punctuation, whitespace
    n = len(task.stream("train")) + len(task.stream("test"))
    assert n == text_module.DEFAULT_CHARS
    assert "def " in task.decode(task.stream("train")[:20000])
    again = build_task(Cfg(task="text"))  # cached: the very same ids, no second read
    assert again.stream("train").data_ptr() == task.stream("train").data_ptr()


# --- scoring ------------------------------------------------------------------------------


def test_score_counts_only_target_positions() -> None:
    targets = torch.tensor([[IGNORE, 5, 6, IGNORE], [IGNORE, 7, 8, IGNORE], [IGNORE] * 4])
    preds = torch.tensor([[9, 5, 6, 9], [9, 7, 0, 9], [1, 2, 3, 4]])
    s = score(preds, targets)
    assert s == Score(correct=3, scored=4, exact=1, sequences=2)
    assert s.token_accuracy == 0.75 and s.exact_match == 0.5
    assert (s + s).token_accuracy == 0.75 and (s + s).sequences == 4
    labels = torch.tensor([0, 1, 1, 0])
    assert score(torch.tensor([0, 1, 0, 0]), labels) == Score(3, 4, 3, 4)


@pytest.mark.parametrize("name", ALGORITHMIC)
def test_score_of_a_real_batch(name: str) -> None:
    b = build_task(Cfg(task=name)).batch(16, 0, gen(), "train")
    perfect = torch.where(b.targets == IGNORE, 0, b.targets)
    assert score(perfect, b.targets) == Score(
        int((b.targets != IGNORE).sum()), int((b.targets != IGNORE).sum()), 16, 16
    )
    wrong = perfect.clone()
    first = int((b.targets[0] != IGNORE).nonzero()[0])
    wrong[0, first] += 1
    s = score(wrong, b.targets)
    assert s.exact == 15 and s.correct == s.scored - 1


def test_a_length_curriculum_grows_the_largest_size_evenly_to_the_range_end() -> None:
    """Sizes 1-20 over 10 steps: the largest size drawn at step s is 1 + ceil(19 (s + 1) / 10),
    20 from the curriculum's last step on; with no curriculum, 20 from the start."""
    ramp = [curriculum_largest(step, (1, 20), 10) for step in range(12)]
    assert ramp == [3, 5, 7, 9, 11, 13, 15, 17, 19, 20, 20, 20]
    assert curriculum_largest(0, (1, 20), 0) == 20
    assert curriculum_largest(0, (5, 5), 100) == 5


@pytest.mark.parametrize("largest", [1, 4, 9])
def test_a_training_batch_under_a_curriculum_draws_no_size_past_its_largest(largest: int) -> None:
    """Copy's sequence of size n holds 2n + 3 tokens (BOS, SEP, EOS): count them per row."""
    task = build_task(Cfg(task="copy", vocab=6, train_lengths=[1, 9]))
    seen = set()
    for seed in range(20):
        batch = task.batch(64, 0, torch.Generator().manual_seed(seed), "train", largest=largest)
        real = (batch.tokens != 0).sum(1) if batch.key_mask is None else batch.key_mask.sum(1)
        seen |= {(int(t) - 3) // 2 for t in real}
    assert seen == set(range(1, largest + 1))  # every size up to it, none past it


@pytest.mark.parametrize("name", ["parity", "parity-scratchpad"])
def test_uniform_ones_spread_the_training_counts_and_leave_the_test_alone(name: str) -> None:
    """With ``ones="uniform"`` the count of ones in a training row of size n is uniform in 0..n
    (fair bits give 15 or more of 20 in 2 % of rows), every answer is still the running count
    mod 2, recomputed here bit by bit; test batches are the fair bits of the default task."""
    task = build_task(Cfg(task=name, train_lengths=[20, 20], ones="uniform"))
    b = task.batch(4200, 0, gen(7), "train")
    bits = (b.tokens[:, 1:21] - 4).tolist()
    counts = [sum(row) for row in bits]
    per_count = [counts.count(k) for k in range(21)]
    assert min(per_count) > 140 and max(per_count) < 270  # 200 expected for each of 21
    out = (b.tokens[:, 22:-1] - 4).tolist()  # after BOS, 20 bits, SEP; before EOS
    for row, answer in zip(bits, out, strict=True):
        running = [sum(row[: i + 1]) % 2 for i in range(20)]
        assert answer == (running if name.endswith("scratchpad") else running[-1:])
    fair = build_task(Cfg(task=name, train_lengths=[20, 20]))
    assert same(task.batch(64, 20, gen(3), "test"), fair.batch(64, 20, gen(3), "test"))
    fair_counts = (fair.batch(4200, 0, gen(7), "train").tokens[:, 1:21] - 4).sum(1)
    assert int((fair_counts >= 15).sum()) < 150  # about 2 % of 4,200
