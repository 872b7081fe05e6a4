"""The kernels' launch rules (heads per CTA), tested without a GPU: tests/host/launch_rules_probe.cu calls
the header's rule on each query, compiled here with nvcc. Where no GPU answers, the rule counts the H200's
132 SMs, the machine these expectations (and the measurements behind the rules) come from."""

import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def find_nvcc():
    for candidate in (os.environ.get("CUDACXX"), shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"):
        if candidate and os.path.exists(candidate):
            return candidate
    return None


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    nvcc = find_nvcc()
    if nvcc is None:
        pytest.skip("nvcc not found ($CUDACXX, PATH, /usr/local/cuda/bin/nvcc)")
    exe = str(tmp_path_factory.mktemp("probe") / "launch_rules_probe")
    build = subprocess.run([nvcc, "-std=c++17", "--expt-relaxed-constexpr", "-arch=sm_90a", "-I", os.path.join(ROOT, "csrc"),
                            os.path.join(ROOT, "tests", "host", "launch_rules_probe.cu"), "-o", exe],
                           capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr

    def answers(lines):
        out = subprocess.run([exe], input="".join(lines), capture_output=True, text=True, timeout=60,
                             check=True).stdout.splitlines()
        assert out[0].startswith("sms ")
        if int(out[0].split()[1]) != 132:
            pytest.skip(f"this machine's GPU has {out[0].split()[1]} SMs; the expectations are the H200's 132")
        return out[1:]

    def heads_per_cta(queries, fill_last_wave=False, half_below_four_waves=False):
        return [int(v) for v in answers(f"{b} {h} {g} {c} {w} {int(o)} {int(f)} {int(fill_last_wave)} "
                                        f"{int(half_below_four_waves)} {k}\n" for b, h, g, c, w, o, f, k in queries)]

    def fold_split(queries):
        lines = answers(f"split {b} {h} {g} {L} {c} {hk} {sk}\n" for b, h, g, L, c, hk, sk in queries)
        return [tuple(int(v) for v in line.split()) for line in lines]

    def two_group(queries):
        return [int(v) for v in answers(f"twogroup {b} {g} {c} {int(r)} {gk} {hk}\n" for b, g, c, r, gk, hk in queries)]

    return heads_per_cta, fold_split, two_group


NANO4B, SUPER120B, THREE_PER_GROUP = (96, 8), (128, 8), (24, 8)

# (dims, CTAs per SM, waves, one_wave, full_waves, knob) -> {batch: heads per CTA}. The step passes waves 2
# where its replay runs on tensor cores (read copies: 3 CTAs an SM on the H200; the fp32 checkpoint
# without one by default: 2 at nano4b, 3 at super120b), 4 on CUDA cores (REPLAYSSM_STEP_TF32_REPLAY=0
# without a copy: 2 CTAs an SM at nano4b) and under the staggered-flush hint, one_wave = not the hint, and
# full_waves = CUDA cores and not the hint; verify passes the defaults (4 waves, neither).
CASES = [
    # Tensor-core step. Below one CTA per (row, group) and SM (batch <= 16): the smallest part of a group
    # whose CTAs the 396 resident slots hold (session 23); batch 17-49 whole groups in one wave (session
    # 21); beyond, whole groups while they make 2 waves (792 CTAs), else the next divisor.
    ((NANO4B, 3, 2, True, False, "-"), {1: 1, 4: 1, 8: 2, 16: 4, 17: 12, 32: 12, 49: 12, 50: 6, 98: 6, 99: 12, 256: 12}),
    ((SUPER120B, 3, 2, True, False, "-"), {1: 1, 2: 1, 4: 2, 8: 4, 16: 8, 32: 16, 256: 16}),
    ((THREE_PER_GROUP, 3, 2, True, False, "-"), {4: 1, 16: 1, 17: 3}),
    # The edges: CTAs exactly the resident ones (99 heads x batch 4 = 396) still one wave; batch x groups
    # exactly the SMs (33 x 4) takes whole groups, one row fewer (32 x 4 = 128) the below-one-wave rule.
    (((99, 9), 3, 2, True, False, "-"), {4: 1, 5: 11}),
    (((96, 4), 3, 2, True, False, "-"), {32: 8, 33: 24}),
    # CUDA-core step (264 resident): batch 8 takes 3 heads (256 CTAs), 11 4 heads (264), 34 the 4-wave
    # rule. Past one wave at 2 CTAs an SM (full_waves), the largest part whose CTAs fill their last wave
    # to 95%: batch 48 6 heads (768 CTAs, 2.91 waves; the 4-wave rule's 4), 64-192 whole groups
    # (1.94-5.82 waves); batch 40 and 100 keep the 4-wave rule's 3 and 6 (no larger part fills 95%: 3.64
    # and 3.03 waves), as do the same batches without full_waves and 3 CTAs an SM (super120b's kernels;
    # batch 48 is one wave of whole groups there).
    ((NANO4B, 2, 4, True, True, "-"), {1: 1, 4: 2, 8: 3, 11: 4, 16: 6, 33: 12, 34: 3, 40: 3, 48: 6, 64: 12, 96: 12,
                                       100: 6, 128: 12, 192: 12, 256: 12}),
    ((NANO4B, 2, 4, True, False, "-"), {48: 4, 64: 4, 96: 6, 128: 6}),
    ((SUPER120B, 3, 4, True, True, "-"), {48: 16, 64: 4, 96: 4, 128: 8, 192: 8}),
    # The staggered-flush hint, and verify: four waves of the largest part, one head below them.
    ((NANO4B, 3, 4, False, False, "-"), {16: 1, 32: 1, 64: 3, 256: 12}),
    # The knob: the largest divisor of the group's 12 heads <= its value, whatever the batch; 0 or
    # non-numbers leave the rule.
    ((NANO4B, 3, 2, True, False, "5"), {1: 4, 256: 4}),
    ((NANO4B, 3, 2, True, False, "64"), {1: 12, 16: 12}),
    ((NANO4B, 3, 2, True, False, "1"), {32: 1, 256: 1}),
    ((NANO4B, 3, 2, True, False, "0"), {16: 4}),
    ((NANO4B, 3, 2, True, False, "abc"), {16: 4}),
]


def case_id(rule):
    (heads, groups), ctas_per_sm, waves, one_wave, full_waves, knob = rule
    return (f"H{heads}-G{groups}-{ctas_per_sm}ctas-{waves}waves-{'one_wave' if one_wave else 'waves_only'}"
            f"{'-full_waves' if full_waves else ''}-knob{knob}")


@pytest.mark.parametrize("rule,expected", CASES, ids=[case_id(rule) for rule, _ in CASES])
def test_heads_per_cta(probe, rule, expected):
    heads_per_cta, _, _ = probe
    (heads, groups), ctas_per_sm, waves, one_wave, full_waves, knob = rule
    queries = [(batch, heads, groups, ctas_per_sm, waves, one_wave, full_waves, knob) for batch in expected]
    assert dict(zip(expected, heads_per_cta(queries))) == expected


# The tf32 replay without a copy (fill_last_wave; waves 2, one_wave, not full_waves): where the waves
# rule's CTAs leave more than 5% of their waves' slots empty, half-size (or larger) CTAs that leave fewer,
# if at most 10%. nano4b at two CTAs an SM (264 slots): batch 80 whole groups are 640 CTAs in 3 waves
# (81% of 792 slots) -> 6 heads (1280 of 1320, 97%); 208: 1664 of 1848 (90%) -> 6 heads (3328 of 3432);
# 96 / 128 / 192 / 256 / 512 fill 97% with whole groups and keep them; 64 keeps the waves rule's 6 heads
# (1024 of 1056), 48 its 6 heads (768 of 792); 40 and 50: 6 heads (81%, 76%) -> 4 (91%); 56: 6 (85%) -> 3
# (4 heads fill no more). Batch 32 (one wave of whole groups) does not reach the rule.
# super120b at three (396 slots): 80: 8 heads (81%) -> 4 (2560 of 2772, 92%); 112: 16 (75%) -> 8 (90%);
# 256 / 512: 16 (86%, 94%) -> 8 (94%, 99%); 64 and 128 keep theirs (8 and 16 heads: 86%, as are
# half-size CTAs); 144 / 192 fill 97%. Every batch here that changes was measured (session 38's sweeps,
# bench/results/h200_2026-12-04_mamba2_session38.md): none slower, up to 3.9% faster.
FILL_CASES = [
    ((NANO4B, 2), {32: 12, 40: 4, 48: 6, 50: 4, 56: 3, 64: 6, 80: 6, 96: 12, 112: 6, 128: 12, 144: 6, 176: 6,
                   192: 12, 208: 6, 240: 6, 256: 12, 512: 12}),
    ((SUPER120B, 3), {48: 16, 56: 4, 64: 8, 80: 4, 96: 8, 112: 8, 128: 16, 144: 16, 160: 8, 176: 16, 192: 16,
                      256: 8, 512: 8}),
]


def tensor_step_choices(heads_per_cta, rule, batches, **flags):
    """{batch: heads per CTA} of the tensor-core step's launch without the hint (waves 2, one_wave) for
    rule = ((heads, groups), CTAs per SM), with the choose_heads_per_cta flags given."""
    (heads, groups), ctas_per_sm = rule
    queries = [(batch, heads, groups, ctas_per_sm, 2, True, False, "-") for batch in batches]
    return dict(zip(batches, heads_per_cta(queries, **flags)))


@pytest.mark.parametrize("rule,expected", FILL_CASES, ids=[f"H{r[0][0]}-{r[1]}ctas" for r, _ in FILL_CASES])
def test_heads_per_cta_fill_last_wave(probe, rule, expected):
    heads_per_cta, _, _ = probe
    heads = rule[0][0]
    assert tensor_step_choices(heads_per_cta, rule, list(expected), fill_last_wave=True) == expected
    # Without it, the waves rule alone: whole groups (or 8 heads) at the batches above that change.
    plain = tensor_step_choices(heads_per_cta, rule, list(expected))
    assert plain[80] == (12 if heads == 96 else 8) and plain[112] == (12 if heads == 96 else 16)


# The bf16 / fp16 copies' step (half_below_four_waves; waves 2, one_wave, three CTAs an SM: 396 slots):
# where the waves rule takes whole groups (batch 99 on at 8 groups: 792 CTAs) that make fewer than four
# waves (batch x 8 < 1584: up to 197), half a group: 6 heads nano4b, 8 super120b; whole groups from 198 on.
# Below 99 the waves rule's own choice (half groups at 50-98, one-wave rules below 50); 3 heads a group
# have no divisor from 2 up to half of them, and keep whole groups. Measured (session 39, runs 1 and 5):
# half-size CTAs won the bf16 cycle by up to 3.6% at 112-208 (none slower than 0.2% at 99-197) and lost
# 0.3-0.6% at 256-512.
HALF_CASES = [
    ((NANO4B, 3), {32: 12, 49: 12, 50: 6, 64: 6, 98: 6, 99: 6, 112: 6, 160: 6, 197: 6, 198: 12, 256: 12, 512: 12}),
    ((SUPER120B, 3), {32: 16, 64: 8, 99: 8, 112: 8, 197: 8, 198: 16, 256: 16}),
    ((THREE_PER_GROUP, 3), {17: 3, 112: 3}),
]


@pytest.mark.parametrize("rule,expected", HALF_CASES, ids=[f"H{r[0][0]}-{r[1]}ctas" for r, _ in HALF_CASES])
def test_heads_per_cta_half_below_four_waves(probe, rule, expected):
    heads_per_cta, _, _ = probe
    heads, groups = rule[0]
    assert tensor_step_choices(heads_per_cta, rule, list(expected), half_below_four_waves=True) == expected
    # Without it: whole groups from batch 99 on.
    plain = tensor_step_choices(heads_per_cta, rule, list(expected))
    assert plain[112] == heads // groups


# The step's fold split under the staggered-flush hint (choose_fold_split, from the hint's launch of
# choose_heads_per_cta: 4 waves, no one-wave rule): (dims, L, CTAs per SM, knobs) -> {batch: (replay heads
# per CTA, split, fine rows)}; (0, 1, 0) = no split. 396 resident CTAs at 3 an SM.
SPLIT_CASES = [
    # super120b: the hint's one-head CTAs make fewer than 3 waves (1,188) up to batch 8: no split; batch
    # 12: 4-head replay CTAs (384) leave no room for a row of 1- or 2-head folds, so 8-head ones (192 +
    # 112); 16: 8-head replay, one row of 1-head folds (256 + 112 = 368); 24 and 32: whole groups and two
    # rows of 2-head folds; 40: three rows of 2-head folds do not fit (320 + 168); 50: past one wave.
    ((SUPER120B, 16, 3, "-", "-"), {1: (0, 1, 0), 4: (0, 1, 0), 8: (0, 1, 0), 12: (8, 8, 1), 16: (8, 8, 1),
                                   24: (16, 8, 2), 32: (16, 8, 2), 40: (0, 1, 0), 50: (0, 1, 0)}),
    # nano4b (12 heads a group): batch 12's hint launch is 1,152 CTAs (< 3 waves); batch 16's 4-head
    # replay CTAs (384) leave no room, so 6-head ones and one-head folds (256 + 80 = 336); 40 needs folds
    # of 3 heads (more than 2).
    ((NANO4B, 16, 3, "-", "-"), {8: (0, 1, 0), 12: (0, 1, 0), 16: (6, 6, 1), 32: (12, 6, 2), 40: (0, 1, 0)}),
    # A shorter buffer folds more rows per step: batch 16 at L = 4 serves 4 rows, in 2-head CTAs.
    ((SUPER120B, 4, 3, "-", "-"), {16: (16, 8, 4)}),
    # Either knob turns it off.
    ((SUPER120B, 16, 3, "8", "-"), {16: (0, 1, 0)}),
    ((SUPER120B, 16, 3, "-", "0"), {16: (0, 1, 0)}),
    ((SUPER120B, 16, 3, "-", "1"), {16: (8, 8, 1)}),
]


@pytest.mark.parametrize("rule,expected", SPLIT_CASES,
                         ids=[f"H{r[0][0]}-L{r[1]}-{r[2]}ctas-heads{r[3]}-split{r[4]}" for r, _ in SPLIT_CASES])
def test_fold_split(probe, rule, expected):
    _, fold_split, _ = probe
    (heads, groups), L, ctas_per_sm, heads_knob, split_knob = rule
    queries = [(batch, heads, groups, L, ctas_per_sm, heads_knob, split_knob) for batch in expected]
    assert dict(zip(expected, fold_split(queries))) == expected


# The read copies' two-group CTAs (choose_two_group_ctas; by_rule: an fp8 copy), 8 groups at three CTAs
# an SM (396 slots): not while whole groups fit in one wave (batch <= 49: 392 CTAs); two-group CTAs where
# they fit in one (50-99: 200-396); past it only where they fill 95% of their waves' slots: 189-198 (756-792
# of 792: batch 188's 752 is 94.9%), 283-297, 377-396 (1508-1584 of 1584), 471-495; not 128 (512 of 792),
# 160, 256 (1024 of 1188, 86%), 320, 448, 512 (2048 of 2376). Odd group counts never pair up.
TWO_GROUP_CASES = [
    ((8, 3, True, "-", "-"), {32: 0, 49: 0, 50: 1, 64: 1, 99: 1, 100: 0, 128: 0, 160: 0, 188: 0, 189: 1, 192: 1,
                             198: 1, 199: 0, 256: 0, 283: 1, 297: 1, 320: 0, 376: 0, 377: 1, 384: 1, 396: 1, 448: 0,
                             471: 1, 480: 1, 495: 1, 512: 0}),
    # A bf16 copy: never by rule; the knob forces either way.
    ((8, 3, False, "-", "-"), {64: 0, 192: 0, 384: 0}),
    ((8, 3, False, "2", "-"), {64: 1, 256: 1}),
    ((8, 3, True, "1", "-"), {64: 0, 192: 0}),
    # REPLAYSSM_STEP_HEADS_PER_CTA set: the heads knob decides alone.
    ((8, 3, True, "-", "6"), {64: 0, 192: 0}),
    ((9, 3, True, "2", "-"), {64: 0, 192: 0}),
]


@pytest.mark.parametrize("rule,expected", TWO_GROUP_CASES,
                         ids=[f"G{r[0]}-{r[1]}ctas-fp8{int(r[2])}-groups{r[3]}-heads{r[4]}" for r, _ in TWO_GROUP_CASES])
def test_two_group_ctas(probe, rule, expected):
    _, _, two_group = probe
    groups, ctas_per_sm, by_rule, groups_knob, heads_knob = rule
    queries = [(batch, groups, ctas_per_sm, by_rule, groups_knob, heads_knob) for batch in expected]
    assert dict(zip(expected, two_group(queries))) == expected
