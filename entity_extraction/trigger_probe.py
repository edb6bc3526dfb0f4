"""NegEx trigger probe: every trigger of the published NegEx list in short frames around ontology targets.

A generated test set (no labelling by us): each trigger of ``lexicons/negex_triggers_en.tsv`` (Chapman W.W. et
al., J Biomed Inform 2001;34(5):301-310; the NegEx 2 / GenConText list) is put in the frames of its tag, with
ontology finding/condition phrases as targets (:data:`PROBE_TARGETS`, rotated), and the expected assertion is
NegEx's reading of the tag:

========  ==========================================  ======================================
tag       frames (T, U: targets)                      expected assertion of the scored target
========  ==========================================  ======================================
PREN      ``<trigger> T.`` / ``<trigger> U or T.``    absent (T)
POST      ``T <trigger>.``                            absent
PREP      ``<trigger> T.``                            uncertain
POSP      ``T <trigger>.``                            uncertain
PSEU      ``<trigger> T.``                            not absent (a pseudo-negation negates nothing)
CONJ      ``No U <trigger> T.``                       not absent (the conjunction ends the scope of "No")
========  ==========================================  ======================================

Each frame runs through :meth:`EntityExtractor.assert_target` (the target given by its offsets). Accuracy per
tag and overall; the frames of a trigger share a record id (the trigger) for the k-fold split
(:mod:`entity_extraction.folds`, set ``negex-probe``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

NEGEX_FILE = Path(__file__).with_name("lexicons") / "negex_triggers_en.tsv"
#: targets of the frames, each an English synonym of a 2D-CXR finding or condition (schemas/ontology), rotated
PROBE_TARGETS = (
    "pleural effusion",
    "pneumothorax",
    "pneumonia",
    "atelectasis",
    "cardiomegaly",
    "consolidation",
    "pericardial effusion",
    "pulmonary nodule",
    "rib fracture",
    "hiatal hernia",
    "bronchiectasis",
    "pulmonary hypertension",
)
TAGS = ("PREN", "POST", "PREP", "POSP", "PSEU", "CONJ")


@dataclass(frozen=True)
class ProbeFrame:
    """One generated sentence: ``trigger`` and its ``tag``, the scored target's character span, the expected
    reading (``absent``, ``uncertain`` or ``not_absent``)."""

    trigger: str
    tag: str
    text: str
    start: int
    end: int
    expected: str

    def right(self, assertion: str) -> bool:
        """Whether a predicted assertion matches the expected reading."""
        return assertion != "absent" if self.expected == "not_absent" else assertion == self.expected


def read_negex_triggers(path: str | Path = NEGEX_FILE) -> list[tuple[str, str]]:
    """(trigger, tag) pairs of a NegEx trigger file (``trigger<TAB><TAB>[TAG]``; ``#`` lines are comments).

    Raises
    ------
    ValueError
        A line without a known tag.
    """
    out = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        trigger, tag = line.split("\t")[0].strip(), line.rsplit("\t", 1)[-1].strip().strip("[]")
        if tag not in TAGS:
            raise ValueError(f"{Path(path).name}: unknown tag {tag!r} for {trigger!r}")
        out.append((trigger, tag))
    return out


def _frame(trigger: str, tag: str, before: str, target: str, after: str, expected: str) -> ProbeFrame:
    text = before + target + after
    text = text[0].upper() + text[1:]
    return ProbeFrame(trigger, tag, text, len(before), len(before) + len(target), expected)


def build_probe(path: str | Path = NEGEX_FILE, targets: tuple[str, ...] = PROBE_TARGETS) -> list[ProbeFrame]:
    """The probe frames of every trigger (table in the module docstring), targets rotated in file order."""
    frames: list[ProbeFrame] = []
    n = 0

    def nxt() -> str:
        nonlocal n
        n += 1
        return targets[(n - 1) % len(targets)]

    for trigger, tag in read_negex_triggers(path):
        if tag == "PREN":
            frames.append(_frame(trigger, tag, f"{trigger} ", nxt(), ".", "absent"))
            other = nxt()
            frames.append(_frame(trigger, tag, f"{trigger} {other} or ", nxt(), ".", "absent"))
        elif tag in ("POST", "POSP"):
            frames.append(_frame(trigger, tag, "", nxt(), f" {trigger}.", "absent" if tag == "POST" else "uncertain"))
        elif tag == "PREP":
            frames.append(_frame(trigger, tag, f"{trigger} ", nxt(), ".", "uncertain"))
        elif tag == "PSEU":
            frames.append(_frame(trigger, tag, f"{trigger} ", nxt(), ".", "not_absent"))
        else:  # CONJ
            other = nxt()
            frames.append(_frame(trigger, tag, f"no {other} {trigger} ", nxt(), ".", "not_absent"))
    return frames


@dataclass
class ProbeResult:
    """Right/total per tag and the wrong frames (frame, predicted assertion)."""

    right: dict[str, int] = field(default_factory=dict)
    total: dict[str, int] = field(default_factory=dict)
    wrong: list[tuple[ProbeFrame, str]] = field(default_factory=list)

    @property
    def accuracy(self) -> float:
        """Right frames over all frames (0 when empty)."""
        n = sum(self.total.values())
        return sum(self.right.values()) / n if n else 0.0


def score_probe(frames: list[ProbeFrame], extractor) -> ProbeResult:
    """Run every frame through ``extractor.assert_target`` and count the right readings per tag."""
    result = ProbeResult()
    for f in frames:
        assertion = extractor.assert_target(f.text, f.start, f.end)["assertion"]
        result.total[f.tag] = result.total.get(f.tag, 0) + 1
        ok = f.right(assertion)
        result.right[f.tag] = result.right.get(f.tag, 0) + ok
        if not ok:
            result.wrong.append((f, assertion))
    return result


def render_probe(result: ProbeResult, name: str = "NegEx trigger probe") -> str:
    """One line: accuracy overall and right/total per tag."""
    per = ", ".join(f"{t} {result.right.get(t, 0)}/{result.total[t]}" for t in TAGS if t in result.total)
    return (
        f"{name}: accuracy {result.accuracy:.3f} ({sum(result.right.values())} of {sum(result.total.values())}): {per}"
    )
