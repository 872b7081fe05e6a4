"""The launch plans (csrc/launch/), tested without a GPU or nvcc: tests/host/launch_probe.cpp, compiled here
with the C++ compiler alone, answers plan queries for a device given as its SM count (132: the H100 SXM and
the H200, where the rules were measured; 114: the H100 PCIe; 148: the B200), with overrides set through the
same hook as the Python one. The rules and their measurements: docs/TUNING.md."""

import os
import re
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def find_cxx():
    for candidate in (os.environ.get("CXX"), "g++", "c++", "clang++"):
        if candidate and shutil.which(candidate):
            return shutil.which(candidate)
    return None


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    cxx = find_cxx()
    if cxx is None:
        pytest.skip("no C++ compiler found ($CXX, g++, c++, clang++) to build tests/host/launch_probe.cpp")
    exe = str(tmp_path_factory.mktemp("probe") / "launch_probe")
    launch = os.path.join(ROOT, "csrc", "launch")
    sources = sorted(os.path.join(launch, f) for f in os.listdir(launch) if f.endswith(".cpp"))
    build = subprocess.run([cxx, "-std=c++17", "-O1", "-Wall", "-Wextra", "-Werror", "-I", os.path.join(ROOT, "csrc"),
                            os.path.join(ROOT, "tests", "host", "launch_probe.cpp"), *sources, "-o", exe],
                           capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr
    # The probe reads the overrides from its environment the first time: start it with none set.
    env = {k: v for k, v in os.environ.items() if not k.startswith("REPLAYSSM_")}

    def run(lines, sms=132):
        lines = [f"device {sms}", "clear", *lines]
        result = subprocess.run([exe], input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=60,
                                env=env, check=True)
        out = result.stdout.splitlines()
        assert len(out) == len(lines), result.stdout
        return out[2:], result.stderr

    return run


def answers(probe, lines, sms=132, overrides=None):
    """The answers to `lines` (queries), after setting `overrides` ({field: value}) through the hook."""
    sets = [f"set {k} {v}" for k, v in (overrides or {}).items()]
    out, _ = probe([*sets, *lines], sms)
    assert out[:len(sets)] == ["ok"] * len(sets), out
    return out[len(sets):]


NANO4B, SUPER120B, THREE_PER_GROUP = (96, 8), (128, 8), (24, 8)
# Tensor-parallel shards: one of 2 / 4 / 8 GPUs' heads and groups.
NANO4B_TP2, SUPER120B_TP4, SUPER120B_TP8 = (48, 4), (32, 2), (16, 1)

# (dims, CTAs per SM, waves, one_wave, full_waves, step_heads_per_cta) -> {batch: heads per CTA}. The step
# passes waves 2 where its replay runs on tensor cores (read copies, and the fp32 checkpoint without one:
# 3 CTAs an SM, 2 at nano4b without a copy), 4 on CUDA cores and under the staggered-flush hint, one_wave =
# not the hint, and full_waves = CUDA cores and not the hint; verify passes the defaults (4 waves, neither).
CASES = [
    # Tensor-core step. Below one CTA per (row, group) and SM (batch <= 16): the smallest part of a group
    # whose CTAs the 396 resident slots hold; batch 17-49 whole groups in one wave; beyond, whole groups
    # while they make 2 waves (792 CTAs), else the next divisor.
    ((NANO4B, 3, 2, True, False, 0), {1: 1, 4: 1, 8: 2, 16: 4, 17: 12, 32: 12, 49: 12, 50: 6, 98: 6, 99: 12, 256: 12}),
    ((SUPER120B, 3, 2, True, False, 0), {1: 1, 2: 1, 4: 2, 8: 4, 16: 8, 32: 16, 256: 16}),
    ((THREE_PER_GROUP, 3, 2, True, False, 0), {4: 1, 16: 1, 17: 3}),
    # The edges: CTAs exactly the resident ones (99 heads x batch 4 = 396) still one wave; batch x groups
    # exactly the SMs (33 x 4) takes whole groups, one row fewer (32 x 4 = 128) the below-one-wave rule.
    (((99, 9), 3, 2, True, False, 0), {4: 1, 5: 11}),
    (((96, 4), 3, 2, True, False, 0), {32: 8, 33: 24}),
    # CUDA-core step (264 resident): batch 8 takes 3 heads (256 CTAs), 11 4 heads (264), 34 the 4-wave
    # rule. Past one wave at 2 CTAs an SM (full_waves), the largest part whose CTAs fill their last wave
    # to 95%: batch 48 6 heads (768 CTAs, 2.91 waves; the 4-wave rule's 4), 64-192 whole groups
    # (1.94-5.82 waves); batch 40 and 100 keep the 4-wave rule's 3 and 6 (no larger part fills 95%: 3.64
    # and 3.03 waves), as do the same batches without full_waves and 3 CTAs an SM (super120b's kernels;
    # batch 48 is one wave of whole groups there).
    ((NANO4B, 2, 4, True, True, 0), {1: 1, 4: 2, 8: 3, 11: 4, 16: 6, 33: 12, 34: 3, 40: 3, 48: 6, 64: 12, 96: 12,
                                     100: 6, 128: 12, 192: 12, 256: 12}),
    ((NANO4B, 2, 4, True, False, 0), {48: 4, 64: 4, 96: 6, 128: 6}),
    ((SUPER120B, 3, 4, True, True, 0), {48: 16, 64: 4, 96: 4, 128: 8, 192: 8}),
    # The staggered-flush hint, and verify: four waves of the largest part, one head below them.
    ((NANO4B, 3, 4, False, False, 0), {16: 1, 32: 1, 64: 3, 256: 12}),
    # The override: the largest divisor of the group's 12 heads <= its value, whatever the batch; 0 leaves
    # the rule.
    ((NANO4B, 3, 2, True, False, 5), {1: 4, 256: 4}),
    ((NANO4B, 3, 2, True, False, 64), {1: 12, 16: 12}),
    ((NANO4B, 3, 2, True, False, 1), {32: 1, 256: 1}),
    ((NANO4B, 3, 2, True, False, 0), {16: 4}),
]


def heads_line(batch, heads, groups, ctas_per_sm, waves, one_wave, full_waves, fill_last_wave=False, half=False):
    return (f"heads {batch} {heads} {groups} {ctas_per_sm} {waves} {int(one_wave)} {int(full_waves)} "
            f"{int(fill_last_wave)} {int(half)}")


def case_id(rule):
    (heads, groups), ctas_per_sm, waves, one_wave, full_waves, forced = rule
    return (f"H{heads}-G{groups}-{ctas_per_sm}ctas-{waves}waves-{'one_wave' if one_wave else 'waves_only'}"
            f"{'-full_waves' if full_waves else ''}-forced{forced}")


@pytest.mark.parametrize("rule,expected", CASES, ids=[case_id(rule) for rule, _ in CASES])
def test_heads_per_cta(probe, rule, expected):
    (heads, groups), ctas_per_sm, waves, one_wave, full_waves, forced = rule
    lines = [heads_line(b, heads, groups, ctas_per_sm, waves, one_wave, full_waves) for b in expected]
    got = answers(probe, lines, overrides={"step_heads_per_cta": forced} if forced else None)
    assert dict(zip(expected, map(int, got))) == expected


# The tf32 replay without a copy (fill_last_wave; waves 2, one_wave, not full_waves): where the waves
# rule's CTAs leave more than 5% of their waves' slots empty, half-size (or larger) CTAs that leave fewer,
# if at most 10%. nano4b at two CTAs an SM (264 slots): batch 80 whole groups are 640 CTAs in 3 waves
# (81% of 792 slots) -> 6 heads (1280 of 1320, 97%); 208: 1664 of 1848 (90%) -> 6 heads (3328 of 3432);
# 96 / 128 / 192 / 256 / 512 fill 97% with whole groups and keep them; 64 keeps the waves rule's 6 heads
# (1024 of 1056), 48 its 6 heads (768 of 792); 40 and 50: 6 heads (81%, 76%) -> 4 (91%); 56: 6 (85%) -> 3
# (4 heads fill no more). Batch 32 (one wave of whole groups) does not reach the rule.
# super120b at three (396 slots): 80: 8 heads (81%) -> 4 (2560 of 2772, 92%); 112: 16 (75%) -> 8 (90%);
# 256 / 512: 16 (86%, 94%) -> 8 (94%, 99%); 64 and 128 keep theirs (8 and 16 heads: 86%, as are
# half-size CTAs); 144 / 192 fill 97%. Every batch here that changes was measured: none slower, up to
# 3.9% faster (docs/TUNING.md, fill_last_wave).
FILL_CASES = [
    ((NANO4B, 2), {32: 12, 40: 4, 48: 6, 50: 4, 56: 3, 64: 6, 80: 6, 96: 12, 112: 6, 128: 12, 144: 6, 176: 6,
                   192: 12, 208: 6, 240: 6, 256: 12, 512: 12}),
    ((SUPER120B, 3), {48: 16, 56: 4, 64: 8, 80: 4, 96: 8, 112: 8, 128: 16, 144: 16, 160: 8, 176: 16, 192: 16,
                      256: 8, 512: 8}),
]


def tensor_step_choices(probe, rule, batches, fill_last_wave=False, half=False):
    """{batch: heads per CTA} of the tensor-core step's rule without the hint (waves 2, one_wave) for
    rule = ((heads, groups), CTAs per SM)."""
    (heads, groups), ctas_per_sm = rule
    lines = [heads_line(b, heads, groups, ctas_per_sm, 2, True, False, fill_last_wave, half) for b in batches]
    return dict(zip(batches, map(int, answers(probe, lines))))


@pytest.mark.parametrize("rule,expected", FILL_CASES, ids=[f"H{r[0][0]}-{r[1]}ctas" for r, _ in FILL_CASES])
def test_heads_per_cta_fill_last_wave(probe, rule, expected):
    heads = rule[0][0]
    assert tensor_step_choices(probe, rule, list(expected), fill_last_wave=True) == expected
    # Without it, the waves rule alone: whole groups (or 8 heads) at the batches above that change.
    plain = tensor_step_choices(probe, rule, list(expected))
    assert plain[80] == (12 if heads == 96 else 8) and plain[112] == (12 if heads == 96 else 16)


# The bf16 / fp16 copies' step (half_below_four_waves; waves 2, one_wave, three CTAs an SM: 396 slots):
# where the waves rule takes whole groups (batch 99 on at 8 groups: 792 CTAs) that make fewer than four
# waves (batch x 8 < 1584: up to 197), half a group: 6 heads nano4b, 8 super120b; whole groups from 198 on.
# Below 99 the waves rule's own choice (half groups at 50-98, one-wave rules below 50); 3 heads a group
# have no divisor from 2 up to half of them, and keep whole groups.
HALF_CASES = [
    ((NANO4B, 3), {32: 12, 49: 12, 50: 6, 64: 6, 98: 6, 99: 6, 112: 6, 160: 6, 197: 6, 198: 12, 256: 12, 512: 12}),
    ((SUPER120B, 3), {32: 16, 64: 8, 99: 8, 112: 8, 197: 8, 198: 16, 256: 16}),
    ((THREE_PER_GROUP, 3), {17: 3, 112: 3}),
]


@pytest.mark.parametrize("rule,expected", HALF_CASES, ids=[f"H{r[0][0]}-{r[1]}ctas" for r, _ in HALF_CASES])
def test_heads_per_cta_half_below_four_waves(probe, rule, expected):
    heads, groups = rule[0]
    assert tensor_step_choices(probe, rule, list(expected), half=True) == expected
    # Without it: whole groups from batch 99 on.
    assert tensor_step_choices(probe, rule, list(expected))[112] == heads // groups


# The step's fold split under the staggered-flush hint (from the hint's launch: 4 waves, no one-wave rule):
# (dims, L, CTAs per SM, overrides) -> {batch: (replay heads per CTA, split, fine rows)}; (0, 1, 0) = no
# split. 396 resident CTAs at 3 an SM.
SPLIT_CASES = [
    # super120b: the hint's one-head CTAs make fewer than 3 waves (1,188) up to batch 8: no split; batch
    # 12: 4-head replay CTAs (384) leave no room for a row of 1- or 2-head folds, so 8-head ones (192 +
    # 112); 16: 8-head replay, one row of 1-head folds (256 + 112 = 368); 24 and 32: whole groups and two
    # rows of 2-head folds; 40: three rows of 2-head folds do not fit (320 + 168); 50: past one wave.
    ((SUPER120B, 16, 3, {}), {1: (0, 1, 0), 4: (0, 1, 0), 8: (0, 1, 0), 12: (8, 8, 1), 16: (8, 8, 1),
                              24: (16, 8, 2), 32: (16, 8, 2), 40: (0, 1, 0), 50: (0, 1, 0)}),
    # nano4b (12 heads a group): batch 12's hint launch is 1,152 CTAs (< 3 waves); batch 16's 4-head
    # replay CTAs (384) leave no room, so 6-head ones and one-head folds (256 + 80 = 336); 40 needs folds
    # of 3 heads (more than 2).
    ((NANO4B, 16, 3, {}), {8: (0, 1, 0), 12: (0, 1, 0), 16: (6, 6, 1), 32: (12, 6, 2), 40: (0, 1, 0)}),
    # Sharded heads: from 2 waves where every step folds (batch >= L). super120b@tp8 (16 heads, one group):
    # batch 48's hint launch is 768 CTAs (< 792), 50's 800: 4-head replay CTAs and one-head folds of 4 rows
    # (200 + 48), batch 64 (256 + 48), 75 (3 waves by the first rule; 5 rows). super120b@tp4 batch 32
    # (1,024 CTAs): 4-head replays, two rows of one-head folds (256 + 48); batch 24 (768) none.
    ((SUPER120B_TP8, 16, 3, {}), {32: (0, 1, 0), 48: (0, 1, 0), 50: (4, 4, 4), 64: (4, 4, 4), 75: (4, 4, 5)}),
    ((SUPER120B_TP4, 16, 3, {}), {24: (0, 1, 0), 32: (4, 4, 2)}),
    # ... but not where some steps fold nothing (batch < L): L = 64 at batch 50 (super120b at batch 8, above).
    ((SUPER120B_TP8, 64, 3, {}), {50: (0, 1, 0), 64: (4, 4, 1)}),
    # A shorter buffer folds more rows per step: batch 16 at L = 4 serves 4 rows, in 2-head CTAs.
    ((SUPER120B, 4, 3, {}), {16: (16, 8, 4)}),
    # Either override turns it off; -1 is the rule.
    ((SUPER120B, 16, 3, {"step_heads_per_cta": 8}), {16: (0, 1, 0)}),
    ((SUPER120B, 16, 3, {"step_fold_split": 0}), {16: (0, 1, 0)}),
    ((SUPER120B, 16, 3, {"step_fold_split": -1}), {16: (8, 8, 1)}),
    # step_fold_split = k >= 1: folds of k heads (the largest divisor of the replay block <= k) from the
    # rule's replay block where the rule splits (super120b@tp4 batch 64: 8 heads), else from the hint's
    # own block, in any number of waves (batch 256: 4-head CTAs, 5 waves); none where the block is not
    # larger (super120b@tp8 batch 32: 1 head) or the grid's rows would pass 65535.
    ((SUPER120B_TP4, 16, 3, {"step_fold_split": 2}), {64: (8, 4, 4), 128: (16, 8, 8)}),
    ((SUPER120B_TP4, 16, 3, {"step_fold_split": 1}), {64: (8, 8, 4), 128: (16, 16, 8), 256: (4, 4, 16)}),
    ((SUPER120B_TP8, 16, 3, {"step_fold_split": 1}), {64: (4, 4, 4), 32: (0, 1, 0)}),
    ((NANO4B_TP2, 16, 3, {"step_fold_split": 5}), {64: (12, 3, 4)}),
    ((SUPER120B, 16, 3, {"step_fold_split": 8}), {60000: (16, 2, 3750), 61000: (16, 2, 3813), 65000: (0, 1, 0)}),
    # step_staggered_heads_per_cta: the replay block by hand; the split only where step_fold_split >= 1.
    ((SUPER120B_TP8, 16, 3, {"step_staggered_heads_per_cta": 4}), {32: (0, 1, 0), 64: (0, 1, 0)}),
    ((SUPER120B_TP8, 16, 3, {"step_staggered_heads_per_cta": 4, "step_fold_split": 1}), {32: (4, 4, 2), 64: (4, 4, 4)}),
    ((SUPER120B_TP8, 16, 3, {"step_staggered_heads_per_cta": 2, "step_fold_split": 2}), {64: (0, 1, 0)}),
]


@pytest.mark.parametrize("rule,expected", SPLIT_CASES,
                         ids=[f"H{r[0][0]}-L{r[1]}-{r[2]}ctas-{'-'.join(f'{k}{v}' for k, v in r[3].items()) or 'rule'}"
                              for r, _ in SPLIT_CASES])
def test_fold_split(probe, rule, expected):
    (heads, groups), L, ctas_per_sm, overrides = rule
    got = answers(probe, [f"split {b} {heads} {groups} {L} {ctas_per_sm}" for b in expected], overrides=overrides)
    assert dict(zip(expected, (tuple(map(int, line.split())) for line in got))) == expected


# The read copies' two-group CTAs (by_rule: an fp8 copy), 8 groups at three CTAs an SM (396 slots): not
# while whole groups fit in one wave (batch <= 49: 392 CTAs); two-group CTAs where they fit in one (50-99:
# 200-396); past it only where they fill 95% of their waves' slots: 189-198 (756-792 of 792: batch 188's
# 752 is 94.9%), 283-297, 377-396 (1508-1584 of 1584), 471-495; not 128 (512 of 792), 160, 256 (1024 of
# 1188, 86%), 320, 448, 512 (2048 of 2376). Odd group counts never pair up.
TWO_GROUP_CASES = [
    ((8, 3, True, {}), {32: 0, 49: 0, 50: 1, 64: 1, 99: 1, 100: 0, 128: 0, 160: 0, 188: 0, 189: 1, 192: 1,
                        198: 1, 199: 0, 256: 0, 283: 1, 297: 1, 320: 0, 376: 0, 377: 1, 384: 1, 396: 1, 448: 0,
                        471: 1, 480: 1, 495: 1, 512: 0}),
    # A bf16 copy: never by rule; the override forces either way.
    ((8, 3, False, {}), {64: 0, 192: 0, 384: 0}),
    ((8, 3, False, {"step_groups_per_cta": 2}), {64: 1, 256: 1}),
    ((8, 3, True, {"step_groups_per_cta": 1}), {64: 0, 192: 0}),
    # step_heads_per_cta set: the heads override decides alone.
    ((8, 3, True, {"step_heads_per_cta": 6}), {64: 0, 192: 0}),
    ((9, 3, True, {"step_groups_per_cta": 2}), {64: 0, 192: 0}),
]


@pytest.mark.parametrize("rule,expected", TWO_GROUP_CASES,
                         ids=[f"G{r[0]}-{r[1]}ctas-fp8{int(r[2])}-{'-'.join(f'{k}{v}' for k, v in r[3].items()) or 'rule'}"
                              for r, _ in TWO_GROUP_CASES])
def test_two_group_ctas(probe, rule, expected):
    groups, ctas_per_sm, by_rule, overrides = rule
    got = answers(probe, [f"twogroup {b} {groups} {ctas_per_sm} {int(by_rule)}" for b in expected], overrides=overrides)
    assert dict(zip(expected, map(int, got))) == expected


# ---- whole step plans: which kernel, its CTAs and grid (the launcher launches exactly this) ----

def step_plan(probe, batch, dims, copy, staggered=False, L=16, ctas_per_sm=3, fp32=True, tensor=True,
              workspace=None, sms=132, overrides=None):
    heads, groups = dims
    workspace = staggered if workspace is None else workspace
    line = (f"step {batch} {heads} {groups} {L} {ctas_per_sm} {copy} {int(fp32)} {int(tensor)} {int(staggered)} "
            f"{int(workspace)}")
    kernel, *numbers = answers(probe, [line], sms=sms, overrides=overrides)[0].split()
    return (kernel, *map(int, numbers))


def test_step_plan_lock_step(probe):
    # fp8 copy, nano4b: one-wave rules below 50, two-group CTAs at 50-99 (whole groups in one wave), 2-wave
    # whole groups at 256 (its two-group CTAs would fill 86% of their waves).
    assert step_plan(probe, 32, NANO4B, "fp8") == ("plain", 12, 1, 0, 8, 32)
    assert step_plan(probe, 64, NANO4B, "fp8") == ("two_groups", 24, 1, 0, 4, 64)
    assert step_plan(probe, 256, NANO4B, "fp8") == ("plain", 12, 1, 0, 8, 256)
    # bf16 copy: never two groups by rule; half groups below four waves of whole groups.
    assert step_plan(probe, 64, NANO4B, "16") == ("plain", 6, 1, 0, 16, 64)
    assert step_plan(probe, 112, NANO4B, "16") == ("plain", 6, 1, 0, 16, 112)
    # The fp32 checkpoint without a copy (tf32 replay, 2 CTAs an SM at nano4b): fill_last_wave at 80.
    assert step_plan(probe, 80, NANO4B, "none", ctas_per_sm=2) == ("plain", 6, 1, 0, 16, 80)
    # A 16-bit checkpoint without a copy on CUDA cores (2 CTAs an SM): full_waves at 48.
    assert step_plan(probe, 48, NANO4B, "none", ctas_per_sm=2, fp32=False, tensor=False) == ("plain", 6, 1, 0, 16, 48)
    # The hint without its workspace never orders.
    assert step_plan(probe, 256, NANO4B, "fp8", staggered=True, workspace=False)[0] == "plain"


def test_step_plan_staggered(probe):
    # The fold split (batch 16-32 at nano4b): replay CTAs of 6 heads, the folding row's in 1-head CTAs,
    # the 5 other parts of its replay-sized blocks on helper rows first.
    assert step_plan(probe, 16, NANO4B, "fp8", staggered=True) == ("ordered", 6, 6, 1, 16, 16 + 5)
    assert step_plan(probe, 32, NANO4B, "fp8", staggered=True) == ("ordered", 12, 6, 2, 8, 32 + 10)
    # Past one wave of whole groups: the order pass with the 4-wave rule's CTAs (3 heads at batch 64).
    assert step_plan(probe, 64, NANO4B, "fp8", staggered=True) == ("ordered", 3, 1, 0, 32, 64)
    # One head a CTA (batch 8): not ordered; the override step_order = 1 orders it anyway, 0 never.
    assert step_plan(probe, 8, NANO4B, "fp8", staggered=True) == ("plain", 1, 1, 0, 96, 8)
    assert step_plan(probe, 8, NANO4B, "fp8", staggered=True, overrides={"step_order": 1})[0] == "ordered"
    assert step_plan(probe, 64, NANO4B, "fp8", staggered=True, overrides={"step_order": 0})[0] == "plain"
    assert step_plan(probe, 16, NANO4B, "fp8", staggered=True, overrides={"step_order": 0}) == ("plain", 1, 1, 0, 96, 16)
    # Without a copy (tf32 replay) the pass needs 3 heads a CTA: 2 at nano4b batch 32 (2 CTAs an SM) is plain.
    assert step_plan(probe, 32, NANO4B, "none", staggered=True, ctas_per_sm=2) == ("plain", 2, 1, 0, 48, 32)
    assert step_plan(probe, 64, NANO4B, "none", staggered=True, ctas_per_sm=2) == ("ordered", 4, 1, 0, 24, 64)
    # A 16-bit checkpoint without a copy (bf16 activations: the tensor-core replay, 3 CTAs an SM) by the
    # same rule: the launches measured with the pass forced, where it won (docs/TUNING.md, order pass).
    bf16 = dict(staggered=True, fp32=False, tensor=True)
    assert step_plan(probe, 64, SUPER120B, "none", **bf16) == ("ordered", 4, 1, 0, 32, 64)
    assert step_plan(probe, 256, SUPER120B, "none", **bf16) == ("ordered", 16, 1, 0, 8, 256)
    assert step_plan(probe, 64, SUPER120B_TP4, "none", **bf16) == ("ordered", 8, 8, 4, 4, 64 + 28)
    assert step_plan(probe, 256, SUPER120B_TP8, "none", **bf16) == ("ordered", 16, 8, 16, 1, 256 + 112)
    assert step_plan(probe, 256, NANO4B_TP2, "none", **bf16) == ("ordered", 6, 1, 0, 8, 256)
    # Its one measured loss, one-head CTAs at super120b@tp8 batch 32, stays plain unless forced.
    assert step_plan(probe, 32, SUPER120B_TP8, "none", **bf16) == ("plain", 1, 1, 0, 16, 32)
    assert step_plan(probe, 32, SUPER120B_TP8, "none", **bf16, overrides={"step_order": 1})[0] == "ordered"
    assert step_plan(probe, 64, SUPER120B, "none", **bf16, overrides={"step_order": 0})[0] == "plain"
    # On CUDA cores (a 16-bit checkpoint of the other type than the activations, 2 CTAs an SM) alike.
    assert step_plan(probe, 256, NANO4B, "none", staggered=True, fp32=False, tensor=False) == (
        "ordered", 12, 1, 0, 8, 256)
    # No two-group CTAs under the hint, even forced.
    assert step_plan(probe, 64, NANO4B, "fp8", staggered=True, overrides={"step_groups_per_cta": 2})[0] != "two_groups"


def test_step_plan_staggered_overrides(probe):
    # step_staggered_heads_per_cta: the hint's launch takes the block by hand (super120b@tp8 batch 64: the
    # lock-step launch's 4 heads, one wave) and the lock-step launch keeps its rules (two-group CTAs at
    # nano4b batch 64 with an fp8 copy).
    k4 = {"step_staggered_heads_per_cta": 4}
    assert step_plan(probe, 32, SUPER120B_TP8, "fp8", staggered=True) == ("plain", 1, 1, 0, 16, 32)
    # (batch 64 splits by rule: test_fold_split; the same launch as the overrides' below.)
    assert step_plan(probe, 64, SUPER120B_TP8, "fp8", staggered=True) == ("ordered", 4, 4, 4, 4, 64 + 12)
    assert step_plan(probe, 64, SUPER120B_TP8, "fp8", staggered=True, overrides={**k4, "step_order": 0}) == (
        "plain", 4, 1, 0, 4, 64)
    assert step_plan(probe, 64, SUPER120B_TP8, "fp8", overrides=k4) == ("plain", 4, 1, 0, 4, 64)
    assert step_plan(probe, 64, NANO4B, "fp8", overrides={"step_staggered_heads_per_cta": 8}) == (
        "two_groups", 24, 1, 0, 4, 64)
    # With step_fold_split: the 4 folding rows of batch 64 in one-head CTAs, 3 helper rows each.
    assert step_plan(probe, 64, SUPER120B_TP8, "fp8", staggered=True, overrides={**k4, "step_fold_split": 1}) == (
        "ordered", 4, 4, 4, 4, 64 + 12)
    # step_order = 0 still turns the pass and the split off; step_heads_per_cta still decides alone.
    assert step_plan(probe, 64, SUPER120B_TP8, "fp8", staggered=True,
                     overrides={**k4, "step_fold_split": 1, "step_order": 0}) == ("plain", 4, 1, 0, 4, 64)
    assert step_plan(probe, 64, SUPER120B_TP8, "fp8", staggered=True,
                     overrides={"step_staggered_heads_per_cta": 8, "step_heads_per_cta": 2})[1] == 2
    # The largest divisor of the group size (nano4b@tp2: 12 heads a group, 5 -> 4); a 16-bit checkpoint
    # without a copy takes the block and the split as the others do.
    assert step_plan(probe, 64, NANO4B_TP2, "16", staggered=True, overrides={"step_staggered_heads_per_cta": 5}) == (
        "ordered", 4, 1, 0, 12, 64)
    assert step_plan(probe, 64, SUPER120B_TP8, "none", staggered=True, fp32=False, tensor=False,
                     overrides={**k4, "step_fold_split": 1}) == ("ordered", 4, 4, 4, 4, 64 + 12)


def test_step_plan_other_gpus(probe):
    # The rules count the SMs they are given. nano4b, fp8 copy: two-group CTAs where whole groups pass one
    # wave and the pairs fit in one: batch 64 on 114 SMs (H100 PCIe: 342 resident; 256 pairs), batch 111
    # on 148 (B200: 444 resident, 444 pairs) but not on 132 (444 pairs fill 56% of two waves' 792 slots).
    assert step_plan(probe, 64, NANO4B, "fp8", sms=114) == ("two_groups", 24, 1, 0, 4, 64)
    assert step_plan(probe, 111, NANO4B, "fp8", sms=148) == ("two_groups", 24, 1, 0, 4, 111)
    assert step_plan(probe, 111, NANO4B, "fp8", sms=132) == ("plain", 12, 1, 0, 8, 111)
    # One wave of whole groups ends at batch 42 on 114 SMs (42 x 8 = 336 <= 342), 55 on 148 (440 <= 444);
    # on 132 SMs batch 55 takes the 2-wave rule's half groups.
    assert step_plan(probe, 42, NANO4B, "fp8", sms=114) == ("plain", 12, 1, 0, 8, 42)
    assert step_plan(probe, 55, NANO4B, "16", sms=148) == ("plain", 12, 1, 0, 8, 55)
    assert step_plan(probe, 55, NANO4B, "16", sms=132) == ("plain", 6, 1, 0, 16, 55)


# The fold split on other SM counts (nano4b, L = 16, fp8 copy, three CTAs an SM): on 114 SMs (342
# resident) the hint's one-head launch at batch 12 already makes 3 waves (1152 >= 1026 CTAs), so it
# splits where 132 SMs do not; on 148 (444 resident) batch 40's whole groups (320) and three rows of
# 2-head folds (120) fit in one wave, past 132 SMs' limit.
SPLIT_OTHER_GPUS = [
    (114, {12: (4, 2, 1), 16: (6, 6, 1), 20: (12, 12, 2), 40: (0, 1, 0)}),
    (132, {12: (0, 1, 0), 16: (6, 6, 1), 20: (6, 3, 2), 40: (0, 1, 0)}),
    (148, {12: (0, 1, 0), 16: (4, 2, 1), 20: (6, 3, 2), 40: (12, 6, 3)}),
]


@pytest.mark.parametrize("sms,expected", SPLIT_OTHER_GPUS, ids=[f"{sms}sms" for sms, _ in SPLIT_OTHER_GPUS])
def test_fold_split_other_gpus(probe, sms, expected):
    got = answers(probe, [f"split {b} 96 8 16 3" for b in expected], sms=sms)
    assert dict(zip(expected, (tuple(map(int, line.split())) for line in got))) == expected
    # The step launches it: the ordered kernel with the helper rows of the split's parts.
    for batch, (heads, split, rows) in expected.items():
        plan = step_plan(probe, batch, NANO4B, "fp8", staggered=True, sms=sms)
        if split > 1:
            assert plan == ("ordered", heads, split, rows, 96 // heads, batch + rows * (split - 1))
        else:
            assert plan[2:4] == (1, 0)


# ---- the update: ring stages, grid, claims ----

def update_plan(probe, batch, heads, tile_bytes, ctas_per_sm=2, work_counter=True, sms=132, overrides=None, parts=1):
    line = f"update {batch} {heads} {tile_bytes} {int(work_counter)} {ctas_per_sm} {parts}"
    return tuple(map(int, answers(probe, [line], sms=sms, overrides=overrides)[0].split()))


FP32_80x128, FP32_64x128, BF16_80x128, FP32_128x128 = 80 * 128 * 4, 64 * 128 * 4, 80 * 128 * 2, 128 * 128 * 4


def test_update_stages(probe):
    # Below 5.5 items a CTA of two an SM (1,452 items on 132 SMs), as many tiles (up to 4) as let two
    # CTAs share an SM's 228 KB (2 KB reserved a CTA): 2 for fp32 80 x 128, 3 for fp32 64 x 128, 4 for
    # bf16 and the split's 4 KB items; from there 2. Where two CTAs cannot hold 2 (fp32 128 x 128), as
    # many as one CTA holds (3 of 64 KB in 227 KB) at any batch.
    assert update_plan(probe, 8, 96, FP32_80x128)[0] == 2
    assert update_plan(probe, 10, 128, FP32_64x128)[0] == 3
    assert update_plan(probe, 11, 128, FP32_64x128)[0] == 3
    assert update_plan(probe, 12, 128, FP32_64x128)[0] == 2
    assert update_plan(probe, 45, 32, FP32_64x128)[0] == 3
    assert update_plan(probe, 46, 32, FP32_64x128)[0] == 2
    assert update_plan(probe, 64, 16, FP32_64x128)[0] == 3
    assert update_plan(probe, 15, 96, BF16_80x128)[0] == 4
    assert update_plan(probe, 16, 96, BF16_80x128)[0] == 2
    assert update_plan(probe, 64, 96, BF16_80x128)[0] == 2
    assert update_plan(probe, 2, 32, FP32_8x128, parts=8)[0] == 4
    assert update_plan(probe, 64, 96, FP32_128x128, ctas_per_sm=1)[0] == 3
    assert update_plan(probe, 512, 96, FP32_128x128, ctas_per_sm=1)[0] == 3
    # The threshold follows the SM count: 1,628 items on 148 SMs.
    assert update_plan(probe, 12, 128, FP32_64x128, sms=148)[0] == 3
    assert update_plan(probe, 13, 128, FP32_64x128, sms=148)[0] == 2
    # The override, capped at what fits.
    assert update_plan(probe, 64, 96, BF16_80x128, overrides={"update_stages": 8})[0] == 8
    assert update_plan(probe, 64, 96, FP32_128x128, ctas_per_sm=1, overrides={"update_stages": 8})[0] == 3
    assert update_plan(probe, 64, 96, FP32_80x128, overrides={"update_stages": 1})[0] == 1


def test_update_grid_and_claims(probe):
    # nano4b, fp32 80 x 128 at two CTAs an SM: 264 a wave, 2 ring stages. Claims where 2.25 rounds of
    # items or more lie past the ring's 2 (batch 12: 1152 items, 4.4 rounds), one wave of CTAs; below,
    # fixed shares with the grid trimmed to even them (batch 8: 768 items in 3 rounds of 256; batch 11:
    # 1056 in 4 rounds of 264; batch 10: 960 in 4 rounds of 240).
    assert update_plan(probe, 64, 96, FP32_80x128) == (2, 264, 1)
    assert update_plan(probe, 12, 96, FP32_80x128) == (2, 264, 1)
    assert update_plan(probe, 11, 96, FP32_80x128) == (2, 264, 0)
    assert update_plan(probe, 10, 96, FP32_80x128) == (2, 240, 0)
    assert update_plan(probe, 8, 96, FP32_80x128) == (2, 256, 0)
    # super120b (fp32 64 x 128, 3 stages below 1,452 items): 5.25 rounds, from batch 11 (1408 items);
    # super120b@tp4 (H = 32) from batch 44 (1408), not at 43 or 32; batch 64 (7.8 rounds) takes 2 stages,
    # whose threshold is 4.25 rounds.
    assert update_plan(probe, 11, 128, FP32_64x128) == (3, 264, 1)
    assert update_plan(probe, 10, 128, FP32_64x128) == (3, 256, 0)
    assert update_plan(probe, 64, 32, FP32_64x128) == (2, 264, 1)
    assert update_plan(probe, 44, 32, FP32_64x128) == (3, 264, 1)
    assert update_plan(probe, 43, 32, FP32_64x128)[2] == 0
    assert update_plan(probe, 32, 32, FP32_64x128) == (3, 256, 0)
    # Without the counter's memory: fixed shares. The overrides: claims wherever an item lies past the
    # first S rounds (1), never (0); a capped grid (batch 1 wraps a ring of 10 CTAs).
    assert update_plan(probe, 64, 96, FP32_80x128, work_counter=False) == (2, 256, 0)
    assert update_plan(probe, 8, 96, FP32_80x128, overrides={"update_claims": 1}) == (2, 264, 1)
    assert update_plan(probe, 2, 96, FP32_80x128, overrides={"update_claims": 1}) == (2, 192, 0)
    assert update_plan(probe, 64, 96, FP32_80x128, overrides={"update_claims": 0}) == (2, 256, 0)
    assert update_plan(probe, 1, 96, FP32_80x128, overrides={"update_ctas": 10}) == (2, 10, 1)
    assert update_plan(probe, 1, 96, FP32_80x128, overrides={"update_ctas": 10, "update_claims": 0}) == (2, 10, 0)
    # Other SM counts: a wave of 296 CTAs on 148 SMs, 228 on 114.
    assert update_plan(probe, 64, 96, FP32_80x128, sms=148) == (2, 296, 1)
    assert update_plan(probe, 64, 96, FP32_80x128, sms=114) == (2, 228, 1)


def update_split(probe, batch, heads, parts, sms=132, overrides=None):
    return answers(probe, [f"updatesplit {batch} {heads} {parts}"], sms=sms, overrides=overrides)[0] == "1"


# One pass of state rows: 8 rows of 128 columns, 16 of 64 (256 threads, 4 columns each).
FP32_8x128 = 8 * 128 * 4


def test_update_split(probe):
    # Split where whole heads give at most half an item per SM: super120b at TP 4 (H=32) batch 1 and 2;
    # never at full width (H=128) or nano4b (H=96), where batch 1 already has 96-128 items; TP 8 (H=16)
    # on 148 SMs to batch 4.
    assert [b for b in range(1, 10) if update_split(probe, b, 32, 8)] == [1, 2]
    assert [b for b in range(1, 10) if update_split(probe, b, 128, 8)] == []
    assert [b for b in range(1, 10) if update_split(probe, b, 96, 10)] == []
    assert [b for b in range(1, 10) if update_split(probe, b, 16, 4, sms=148)] == [1, 2, 3, 4]
    assert update_split(probe, 1, 64, 8) and not update_split(probe, 1, 67, 8)  # 2 x 66 = 132
    assert not update_split(probe, 1, 32, 1)  # no one-pass kernel (a head of one pass)
    # The override: always (where the one-pass kernel exists), never.
    assert update_split(probe, 64, 128, 8, overrides={"update_split": 1})
    assert not update_split(probe, 64, 128, 1, overrides={"update_split": 1})
    assert not update_split(probe, 1, 32, 8, overrides={"update_split": 0})


def test_update_split_grid(probe):
    # The split's items (batch x heads x parts) in the same persistent grid: super120b TP 4 at batch 1,
    # 256 one-pass items of 4 KB, one a CTA (4 stages: 4 KB tiles); at full width, 1024 items over a wave
    # of 132 x 4 CTAs in two rounds of 512; batch 4 at TP 4 (1024 items) likewise.
    assert update_plan(probe, 1, 32, FP32_8x128, ctas_per_sm=4, parts=8) == (4, 256, 0)
    assert update_plan(probe, 1, 128, FP32_8x128, ctas_per_sm=4, parts=8) == (4, 512, 0)
    assert update_plan(probe, 4, 32, FP32_8x128, ctas_per_sm=4, parts=8) == (4, 512, 0)
    # update_ctas caps it (128 CTAs of two items, 8 KB a CTA).
    assert update_plan(probe, 1, 32, FP32_8x128, ctas_per_sm=4, parts=8, overrides={"update_ctas": 128}) == (4, 128, 0)


# ---- verify and the fold ----

def test_verify_plan(probe):
    # The base rule at four waves: nano4b batch 256 whole groups (2048 CTAs >= 4 x 396), batch 16 one head.
    assert answers(probe, ["verify 256 96 8 3", "verify 16 96 8 3"]) == ["12 8 256", "1 96 16"]
    assert answers(probe, ["verify 256 96 8 3"], overrides={"verify_heads_per_cta": 5}) == ["4 24 256"]
    # The step's override leaves verify alone.
    assert answers(probe, ["verify 256 96 8 3"], overrides={"step_heads_per_cta": 1}) == ["12 8 256"]


def test_verify_ring(probe):
    # Compiled 4 stages for 2 CTAs an SM (115,712 bytes a CTA): fewer stages down to 2 to keep them, then
    # as few as the 227 KB opt-in limit demands; none where one stage does not fit.
    ring = lambda per_stage: "verifyring 4 2 " + " ".join(str(s * per_stage + 10000) for s in range(1, 5))
    assert answers(probe, [ring(20000), ring(30000), ring(60000), ring(120000), ring(240000)]) == ["4", "3", "2", "1", "0"]


def test_fold_plan(probe):
    # The compiled depth where it fits in the opt-in limit with the static row lists, else 2, else none.
    ring = lambda per_stage: "foldring 3 1000 " + " ".join(str(s * per_stage) for s in range(1, 4))
    assert answers(probe, [ring(70000), ring(80000), ring(120000)]) == ["3", "2", "0"]
    # One wave of persistent CTAs, never more than the (row, head) items.
    assert answers(probe, ["fold 256 96 3 3", "fold 2 4 3 3", "fold 256 96 2 2"]) == ["3 396", "3 8", "2 264"]
    assert answers(probe, ["fold 256 96 3 3"], sms=148) == ["3 444"]


# ---- Gated DeltaNet (csrc/launch/gdn_policy.h) ----

QWEN4B_HV, QWEN122B_HV, TP_HV = 32, 64, 16


def test_gdn_verify_heads_per_cta(probe):
    # Four waves of the largest divisor of HV (2 CTAs an SM, 132 SMs: 264 resident, 1056 for four waves):
    # qwen4b batch 256 takes 4 v-heads (2048 CTAs; 8 would give 1024), batch 512 8, batch 1 one;
    # qwen122b batch 256 8 (2048), the TP shape batch 256 2.
    lines = ["gdnverify 256 32 2", "gdnverify 512 32 2", "gdnverify 1 32 2", "gdnverify 256 64 2", "gdnverify 256 16 2"]
    assert answers(probe, lines) == ["4 8 256", "8 4 512", "1 32 1", "8 8 256", "2 8 256"]
    # The SM count is an input: qwen4b batch 128 takes 4 v-heads (1024 CTAs) on 114 SMs (912 for four
    # waves), 2 on 132 SMs (1056).
    assert answers(probe, ["gdnverify 128 32 2"], sms=114) == ["4 8 128"]
    assert answers(probe, ["gdnverify 128 32 2"], sms=132) == ["2 16 128"]
    # verify_heads_per_cta (shared with mamba2_verify): the largest divisor of HV <= the value.
    assert answers(probe, ["gdnverify 256 32 2", "gdnverify 1 32 2"], overrides={"verify_heads_per_cta": 5}) == \
        ["4 8 256", "4 8 1"]
    assert answers(probe, ["gdnverify 256 32 2"], overrides={"verify_heads_per_cta": 64}) == ["32 1 256"]
    # The step's override leaves verify alone.
    assert answers(probe, ["gdnverify 256 32 2"], overrides={"step_heads_per_cta": 1}) == ["4 8 256"]


def test_gdn_rings(probe):
    # The compiled depth where the CTAs an SM the launch bounds assume keep room for it (2: 115,712 bytes a
    # CTA beside the runtime's 1 KB), fewer down to one stage, none beyond the opt-in limit; the static
    # shared memory (the fold's row list) counts.
    ring = lambda per_stage, static=0: (f"gdnring 4 2 {static} " +
                                        " ".join(str(s * per_stage + 2000) for s in range(1, 5)))
    assert answers(probe, [ring(20000), ring(30000), ring(60000), ring(120000), ring(240000)]) == \
        ["4", "3", "1", "1", "0"]
    assert answers(probe, [ring(28000), ring(28000, static=2336)]) == ["4", "3"]
    # verify at K = V = 128, fp32, L = T = 1 (69,560 bytes a stage): one stage keeps two CTAs an SM.
    assert answers(probe, ["gdnring 8 2 0 69560 135096 200632 266168 331704 397240 462776 528312"]) == ["1"]
    # A GPU with less shared memory an SM keeps fewer stages.
    assert answers(probe, ["device 132 200000 190000", ring(30000)])[1] == "3"


def test_gdn_fold_update_and_step_grids(probe):
    # The fold: one wave of persistent CTAs, never more than the (row, v-head) items.
    assert answers(probe, ["gdnfold 256 32 4 2", "gdnfold 2 16 4 2", "gdnfold 256 64 1 1"]) == \
        ["4 264", "4 32", "1 132"]
    assert answers(probe, ["gdnfold 256 32 4 2"], sms=114) == ["4 228"]
    # A layered fold (LayerCaches): the layers share the resident CTAs, at least one CTA a layer.
    assert answers(probe, ["gdnfold 256 32 4 2 40", "gdnfold 2 1 4 2 40", "gdnfold 256 32 4 2 400"]) == \
        ["4 6", "4 2", "4 1"]
    assert answers(probe, ["fold 256 96 3 3 40", "fold 256 96 3 3 1"]) == ["3 9", "3 396"]
    # The update and its snapshot variant: a CTA per block of a tile's value rows.
    assert answers(probe, ["gdnupdate 8 32 4", "gdnupdate 512 64 2"]) == ["128 8", "128 512"]


def test_gdn_update_split(probe):
    # 4 KB CTAs (16 a tile at K = V = 128 fp32) where 4 x batch x HV <= SMs: qwen4b (HV 32) at batch 1,
    # qwen122b@tp4 (HV 16) to batch 2, kimi48b@tp4 (HV 8) to batch 4 (to 4 on 148 SMs too); never without
    # a split kernel (the snapshot update).
    split = lambda b, hv, sms=132, o=None: answers(probe, [f"gdnupdate {b} {hv} 4 16"], sms=sms, overrides=o)[0]
    assert [b for b in range(1, 12) if split(b, 32).endswith("split")] == [1]
    assert [b for b in range(1, 12) if split(b, 16).endswith("split")] == [1, 2]
    assert [b for b in range(1, 12) if split(b, 8).endswith("split")] == [1, 2, 3, 4]
    assert [b for b in range(1, 12) if split(b, 8, sms=148).endswith("split")] == [1, 2, 3, 4]
    assert [b for b in range(1, 12) if split(b, 2).endswith("split")] == list(range(1, 12))
    assert split(1, 32) == "512 1 split" and split(2, 32) == "128 2"
    assert answers(probe, ["gdnupdate 1 32 4", "gdnupdate 1 32 4 0"]) == ["128 1", "128 1"]
    # The override: always, never.
    assert split(64, 32, o={"gdn_update_split": 1}) == "512 64 split"
    assert split(1, 32, o={"gdn_update_split": 0}) == "128 1"
    assert answers(probe, ["gdnupdate 64 32 4"], overrides={"gdn_update_split": 1}) == ["128 64"]


def test_gdn_step_parts(probe):
    # The step: the most parts (1, 2, 4; V / parts >= 32) whose CTAs do not outnumber the 132 SMs, with or
    # without the staggered-flush hint (under which the fold split adds helper rows to one-part launches:
    # test_gdn_step_fold_split).
    assert answers(probe, ["gdnstep 1 32 128 0", "gdnstep 2 32 128 0", "gdnstep 3 32 128 1 4",
                           "gdnstep 5 32 128 0", "gdnstep 8 32 128 1 3", "gdnstep 64 32 128 0"]) == \
        ["4 128 1", "2 64 2", "1 32 3", "1 32 5", "1 32 11 ordered fold 4 1", "1 32 64"]
    assert answers(probe, ["gdnstep 1 16 128 0", "gdnstep 4 16 128 0", "gdnstep 8 16 128 0", "gdnstep 9 16 128 0"]) == \
        ["4 64 1", "2 32 4", "1 16 8", "1 16 9"]
    # V = 64: at most 2 parts.
    assert answers(probe, ["gdnstep 1 16 64 0", "gdnstep 4 16 64 0", "gdnstep 5 16 64 0"]) == \
        ["2 32 1", "2 32 4", "1 16 5"]
    assert answers(probe, ["gdnstep 1 32 128 0"], sms=64) == ["2 64 1"]
    # A slot's CTAs draw at most 32767 cursor tickets: v_heads x parts stays within it, even when forced.
    assert answers(probe, ["gdnstep 1 16384 128 0", "gdnstep 1 32767 128 0"], overrides={"gdn_step_parts": 4}) == \
        ["1 16384 1", "1 32767 1"]
    assert answers(probe, ["gdnstep 1 8191 128 0"], overrides={"gdn_step_parts": 4}) == ["4 32764 1"]
    # gdn_step_parts forces the largest allowed count <= the value, at any batch.
    assert answers(probe, ["gdnstep 64 32 128 0", "gdnstep 1 32 128 1 3"], overrides={"gdn_step_parts": 4}) == \
        ["4 128 64", "4 128 1"]
    assert answers(probe, ["gdnstep 64 32 128 0", "gdnstep 64 32 64 0"], overrides={"gdn_step_parts": 3}) == \
        ["2 64 64", "2 64 64"]
    assert answers(probe, ["gdnstep 1 32 128 0", "gdnstep 1 16 64 0"], overrides={"gdn_step_parts": 1}) == \
        ["1 32 1", "1 16 1"]
    # The order pass (folding rows first) under the staggered-flush hint where the CTAs take more than one
    # wave (132 x 3 = 396 here) and the caller gave its workspace; gdn_step_order 1 at every staggered
    # launch with a workspace, 0 never.
    assert answers(probe, ["gdnstep 64 32 128 1 3", "gdnstep 64 32 128 0 3", "gdnstep 12 32 128 1 3",
                           "gdnstep 13 32 128 1 3", "gdnstep 64 32 128 1 3 0"]) == \
        ["1 32 64 ordered", "1 32 64", "1 32 12", "1 32 13 ordered", "1 32 64"]
    assert answers(probe, ["gdnstep 1 32 128 1 3", "gdnstep 64 32 128 0 3", "gdnstep 64 32 128 1 3 0"],
                   overrides={"gdn_step_order": 1}) == ["4 128 1 ordered", "1 32 64", "1 32 64"]
    assert answers(probe, ["gdnstep 64 32 128 1 3"], overrides={"gdn_step_order": 0}) == ["1 32 64"]
    # gdn_step_order 2 (experiment): lock-step launches too, wherever the caller gave the workspace.
    assert answers(probe, ["gdnstep 64 32 128 0 3", "gdnstep 64 32 128 0 3 0", "gdnstep 4 32 128 1 3"],
                   overrides={"gdn_step_order": 2}) == ["1 32 64 ordered", "1 32 64", "1 32 4 ordered"]


def test_gdn_step_fold_split(probe):
    # The rule: under the hint, with the workspace and one part a v-head, the first ceil(batch / L) folding
    # rows in 4 CTAs a v-head (2 at V = 64), with the order pass, the grid's helper rows after the batch,
    # where batch x HV <= 2 x SMs (264 here; without a read copy only from batch L / 2), or <= 4 x SMs (528)
    # with a read copy (the last argument).
    assert answers(probe, ["gdnstep 8 32 128 1 3", "gdnstep 8 16 64 1 3", "gdnstep 9 32 128 1 3"]) == \
        ["1 32 11 ordered fold 4 1", "1 16 9 ordered fold 2 1", "1 32 9"]
    assert answers(probe, ["gdnstep 7 32 128 1 3", "gdnstep 7 32 128 1 3 1 16 1", "gdnstep 4 32 128 1 3 1 8"]) == \
        ["1 32 7", "1 32 10 ordered fold 4 1", "1 32 7 ordered fold 4 1"]
    assert answers(probe, ["gdnstep 32 16 128 1 3 1 16 1", "gdnstep 32 16 128 1 3 1 16 0", "gdnstep 16 32 128 1 3 1 16 1",
                           "gdnstep 17 32 128 1 3 1 16 1", "gdnstep 32 32 128 1 3 1 16 1"]) == \
        ["1 16 38 ordered fold 4 2", "1 16 32 ordered", "1 32 19 ordered fold 4 1", "1 32 17 ordered", "1 32 32 ordered"]
    # The override at every batch: 4 (or 2 where V = 64, or 3 -> 2), 1 none.
    assert answers(probe, ["gdnstep 8 32 128 1 3", "gdnstep 64 32 128 1 3", "gdnstep 13 32 128 1 3 1 6",
                           "gdnstep 64 16 64 1 3"], overrides={"gdn_step_fold_parts": 4}) == \
        ["1 32 11 ordered fold 4 1", "1 32 76 ordered fold 4 4", "1 32 22 ordered fold 4 3", "1 16 68 ordered fold 2 4"]
    assert answers(probe, ["gdnstep 8 32 128 1 3"], overrides={"gdn_step_fold_parts": 3}) == ["1 32 9 ordered fold 2 1"]
    assert answers(probe, ["gdnstep 8 32 128 1 3", "gdnstep 32 16 128 1 3 1 16 1"], overrides={"gdn_step_fold_parts": 1}) == \
        ["1 32 8", "1 16 32 ordered"]
    # Not without the hint or the workspace, not with row parts (batch 1), not with the order pass off.
    assert answers(probe, ["gdnstep 8 32 128 0 3", "gdnstep 8 32 128 1 3 0", "gdnstep 1 32 128 1 3"],
                   overrides={"gdn_step_fold_parts": 4}) == ["1 32 8", "1 32 8", "4 128 1"]
    assert answers(probe, ["gdnstep 8 32 128 1 3", "gdnstep 8 32 128 1 3 1 16 1"], overrides={"gdn_step_order": 0}) == \
        ["1 32 8", "1 32 8"]
    # The helper rows keep grid.y within 65535, the CTAs of a slot within the cursor's 32767 tickets.
    assert answers(probe, ["gdnstep 60000 16 128 1 3", "gdnstep 64 16384 128 1 3"], overrides={"gdn_step_fold_parts": 4}) == \
        ["1 16 60000 ordered", "1 16384 64 ordered"]
    # The SM count sets the rule's bounds: on 114 SMs (228) qwen4b b8 (256 tiles) splits only with a copy.
    assert answers(probe, ["gdnstep 8 32 128 1 3", "gdnstep 8 32 128 1 3 1 16 1"], sms=114) == \
        ["1 32 8", "1 32 11 ordered fold 4 1"]


def test_gdn_step_tile_chunks(probe):
    # An fp32 tile without a copy (TILE 1, the last argument) in chunks, one in flight, at every batch and
    # beside the order pass and the fold split; never for a kernel that cannot (an fp8 copy or a 16-bit checkpoint).
    assert answers(probe, ["gdnstep 8 32 128 0 3 1 16 0 1", "gdnstep 256 16 128 0 3 1 16 0 1", "gdnstep 256 32 128 0 3 1 16 0 0",
                           "gdnstep 256 32 128 0 3 1 16 1 0", "gdnstep 1 32 128 0 3 1 16 0 1"]) == \
        ["1 32 8 stages 1", "1 16 256 stages 1", "1 32 256", "1 32 256", "4 128 1 stages 1"]
    assert answers(probe, ["gdnstep 64 32 128 1 3 1 16 0 1", "gdnstep 8 32 128 1 3 1 16 0 1"]) == \
        ["1 32 64 ordered stages 1", "1 32 11 ordered fold 4 1 stages 1"]
    # gdn_step_tile_stages: n chunks in flight, 0 the whole tile; only where the kernel can.
    assert answers(probe, ["gdnstep 1 32 128 0 3 1 16 0 1", "gdnstep 8 32 128 0 3 1 16 0 0"],
                   overrides={"gdn_step_tile_stages": 2}) == ["4 128 1 stages 2", "1 32 8"]
    assert answers(probe, ["gdnstep 256 32 128 0 3 1 16 0 1"], overrides={"gdn_step_tile_stages": 0}) == ["1 32 256"]


def test_gdn_step_staged_copy_tile(probe):
    # A 16-bit read copy on tensor cores (TILE 2) asked for over the set-up where the CTAs outnumber the
    # SMs, lock-step or staggered (beside the order pass and the fold split); at a CTA an SM or fewer
    # (qwen122b@tp4 b8: 128; batch 1 in 4 parts: 128) the one copy.
    assert answers(probe, ["gdnstep 256 32 128 0 4 1 16 1 2", "gdnstep 64 16 128 1 4 1 16 1 2", "gdnstep 8 32 128 1 4 1 16 1 2",
                           "gdnstep 8 16 128 0 4 1 16 1 2", "gdnstep 1 32 128 0 4 1 16 1 2", "gdnstep 256 32 128 0 4 1 16 1 0"]) == \
        ["1 32 256 stages 1", "1 16 64 ordered stages 1", "1 32 11 ordered fold 4 1 stages 1", "1 16 8", "4 128 1", "1 32 256"]
    # The override: 0 the one copy, n >= 1 the staged kernel at any batch.
    assert answers(probe, ["gdnstep 256 32 128 0 4 1 16 1 2"], overrides={"gdn_step_tile_stages": 0}) == ["1 32 256"]
    assert answers(probe, ["gdnstep 8 16 128 0 4 1 16 1 2"], overrides={"gdn_step_tile_stages": 1}) == ["1 16 8 stages 1"]


# ---- programmatic dependent launch: both halves where the tiles do not outnumber the SMs ----

def test_step_starts_during_its_order_pass_unless_overridden(probe):
    # An edge between our order pass and our step only: on by default, whatever the pdl override says.
    assert answers(probe, ["orderpasspdl"]) == ["1"]
    assert answers(probe, ["orderpasspdl"], overrides={"pdl": 0}) == ["1"]
    assert answers(probe, ["orderpasspdl"], overrides={"order_pass_pdl": 0}) == ["0"]
    assert answers(probe, ["orderpasspdl"], overrides={"order_pass_pdl": 1}) == ["1"]


def test_pdl_rule_takes_both_halves_where_the_tiles_fit_the_sms(probe):
    # super120b@tp4 b1 (32 tiles), b4 (128); qwen4b b4 (128); one past the SMs; the full-width b4 (512).
    assert answers(probe, ["pdl 32", "pdl 128", "pdl 132", "pdl 133", "pdl 512", "pdl 0"]) == \
        ["1 1", "1 1", "1 1", "0 0", "0 0", "0 0"]
    assert answers(probe, ["pdl 128", "pdl 114", "pdl 115"], sms=114) == ["0 0", "1 1", "0 0"]
    assert answers(probe, ["pdl 32", "pdl 512"], overrides={"pdl": -1}) == ["1 1", "0 0"]


def test_pdl_override_takes_both_halves_the_wait_only_or_neither(probe):
    assert answers(probe, ["pdl 32", "pdl 100000"], overrides={"pdl": 1}) == ["1 1", "1 1"]
    assert answers(probe, ["pdl 32", "pdl 100000"], overrides={"pdl": 2}) == ["1 0", "1 0"]
    assert answers(probe, ["pdl 32", "pdl 100000"], overrides={"pdl": 0}) == ["0 0", "0 0"]
    out, _ = probe(["set pdl 3", "set pdl -2"])
    assert out == ["error pdl must be in [-1, 2] (-1: the rule), got 3", "error pdl must be in [-1, 2] (-1: the rule), got -2"]


def test_step_warms_l2_wherever_it_waits(probe):
    # A step asks L2 for its cursor, tiles and window before its PDL wait wherever it waits (the rule or
    # either override that waits); pdl_warm=0 asks nothing, and never without the wait.
    assert answers(probe, ["pdlstep 32", "pdlstep 512"]) == ["1 1 1", "0 0 0"]
    assert answers(probe, ["pdlstep 32", "pdlstep 512"], overrides={"pdl": 2}) == ["1 0 1", "1 0 1"]
    assert answers(probe, ["pdlstep 32"], overrides={"pdl": 0, "pdl_warm": 1}) == ["0 0 0"]
    assert answers(probe, ["pdlstep 32", "pdl 32"], overrides={"pdl_warm": 0}) == ["1 1 0", "1 1"]


def test_pdl_from_environment(probe):
    out, err = probe(["env REPLAYSSM_PDL 1", "env REPLAYSSM_PDL 0", "env REPLAYSSM_PDL 2", "env REPLAYSSM_PDL yes",
                      "env REPLAYSSM_PDL -"])
    assert [dict(kv.split("=") for kv in line.split())["pdl"] for line in out] == ["1", "0", "2", "-1", "-1"]
    assert "ignoring REPLAYSSM_PDL=yes (pdl must be an integer)" in err


def test_pdl_launches_go_through_one_helper():
    """With PDL a kernel must wait before it touches global memory: launch_grid (common/
    programmatic_launch.cuh) is the only caller of cudaLaunchKernelEx, and every kernel launched through
    it calls wait_for_prior_grids with its pdl flag (a step's also where it is launched behind its order
    pass)."""
    launchers = {os.path.join("families", "mamba2", "update.cu"): ["update_kernel"],
                 os.path.join("cache", "row_order.cuh"): ["row_order_kernel"],
                 os.path.join("families", "mamba2", "step_kernel.cuh"): ["step_kernel"],
                 os.path.join("families", "gdn", "update.cu"): ["update_kernel"],
                 os.path.join("families", "gdn", "step_kernel.cuh"): ["step_kernel"]}
    users = []
    for folder, _, files in os.walk(os.path.join(ROOT, "csrc")):
        for name in files:
            with open(os.path.join(folder, name), encoding="utf-8") as f:
                text = f.read()
            if "cudaLaunchKernelEx(" in text:
                users.append(os.path.relpath(os.path.join(folder, name), os.path.join(ROOT, "csrc")))
    assert users == [os.path.join("common", "programmatic_launch.cuh")]
    for path, kernels in launchers.items():
        with open(os.path.join(ROOT, "csrc", path), encoding="utf-8") as f:
            text = f.read()
        for kernel in kernels:
            body = text[text.index(f" {kernel}("):]
            assert re.search(r"wait_for_prior_grids\(((launch|a)\.)?pdl(_wait)?( \|\| (launch\.)?after_order_pass)?\);", body), \
                (path, kernel)


# ---- the overrides: the environment (read once) and the hook ----

def test_overrides_from_environment(probe):
    out, err = probe(["env REPLAYSSM_STEP_HEADS_PER_CTA 4", "env REPLAYSSM_VERIFY_HEADS_PER_CTA 3",
                      "env REPLAYSSM_UPDATE_CLAIMS 0", "env REPLAYSSM_STEP_HEADS_PER_CTA abc",
                      "env REPLAYSSM_STEP_ORDER 2", "env REPLAYSSM_STEP_FOLD_SPLIT -2"])
    fields = [dict(kv.split("=") for kv in line.split()) for line in out]
    assert fields[0]["step_heads_per_cta"] == "4"
    assert fields[2]["verify_heads_per_cta"] == "3" and fields[2]["update_claims"] == "0"
    # Not an integer in the field's range: ignored (the rule decides), and said on stderr.
    assert fields[3]["step_heads_per_cta"] == "0"
    assert fields[4]["step_order"] == "-1" and fields[5]["step_fold_split"] == "-1"
    assert "ignoring REPLAYSSM_STEP_HEADS_PER_CTA=abc (step_heads_per_cta must be an integer)" in err
    assert "ignoring REPLAYSSM_STEP_ORDER=2 (step_order must be in [-1, 1]" in err


def test_overrides_hook_checks(probe):
    out, _ = probe(["set step_groups_per_cta 3", "set step_fold_split -2", "set update_claims -1", "set step_orders 1"])
    assert out[0] == "error step_groups_per_cta must be in [0, 2] (0: the rule), got 3"
    assert out[1] == "error step_fold_split must be in [-1, 65535] (-1: the rule), got -2"
    assert out[2] == "ok"
    assert out[3] == "error unknown field step_orders"


def test_the_benchmarks_fallback_list_names_every_override(probe):
    # bench/runner.py lists the fields for when the package cannot (no _C) to report REPLAYSSM_* variables:
    # the same fields, in the same order, as the table the launcher compiles (csrc/launch/overrides.h).
    from replayssm_cuda.bench import runner
    out, _ = probe(["env REPLAYSSM_PDL -"])
    assert tuple(kv.split("=")[0] for kv in out[0].split()) == runner.LAUNCH_FIELDS


def test_no_getenv_outside_overrides():
    """The environment is read in csrc/launch/overrides.cpp only: kernels, device headers and launchers
    take their launch from the plan."""
    readers = []
    for folder, _, files in os.walk(os.path.join(ROOT, "csrc")):
        for name in files:
            path = os.path.join(folder, name)
            with open(path, encoding="utf-8") as f:
                if "getenv" in f.read():
                    readers.append(os.path.relpath(path, ROOT))
    assert readers == [os.path.join("csrc", "launch", "overrides.cpp")]
