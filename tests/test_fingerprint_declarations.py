"""Every config field declares how it enters the experiment fingerprint, and the declarations keep the
fingerprints that recorded runs were written under (docs/reliability.md, "When a record is reused")."""

from __future__ import annotations

import dataclasses

import pytest

from fedhet.config import CHANGED_DEFAULTS, SECTIONS, from_dict, load_run_config
from fedhet.config_sections import fingerprint_kind, neutral

#: Fingerprints of configs as the code before per-field declarations computed them (a hand-kept list of
#: later keys, at ebdd138). Recorded runs carry these; a change here orphans every record of such a run.
PINNED = [
    ({}, "6c8bf9c37b81db49"),
    ({"faults": {"clients": {"2": "noise"}}}, "edf3216d28c6976d"),
    ({"guards": {"update_norm_clip": 0.0}}, "2b6c1f238e1b959e"),
    # CELM with the paper's evidence, its default when these were recorded (a run file of then lacks the key:
    # test_a_celm_run_file_from_before_the_evidence_clip_default_keeps_its_fingerprint)
    (
        {
            "method": {"name": "celm", "params": {"evidence_clip": 0}},
            "data": {"dataset": "digits", "clients": 6},
        },
        "5ecf8d23a51207ac",
    ),
]


def test_every_field_declares_its_fingerprint_kind():
    undeclared = []
    for section, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            try:
                fingerprint_kind(f)
            except TypeError:
                undeclared.append(f"{section}.{f.name}")
    assert not undeclared, f"declare fingerprinted(), neutral() or unfingerprinted() for {undeclared}"


def test_a_field_without_a_declaration_is_refused_by_name():
    @dataclasses.dataclass
    class Section:
        plain: int = 3

    with pytest.raises(TypeError, match="'plain' does not declare"):
        fingerprint_kind(dataclasses.fields(Section)[0])


@pytest.mark.parametrize(("raw", "expected"), PINNED)
def test_fingerprints_of_recorded_runs_are_kept(raw, expected):
    assert from_dict(raw).run_fingerprint() == expected


def test_a_celm_run_file_from_before_the_evidence_clip_default_keeps_its_fingerprint(tmp_path):
    from fedhet.config import to_toml

    raw = {"method": {"name": "celm"}, "data": {"dataset": "digits", "clients": 6}}
    assert from_dict(raw).run_fingerprint() != "5ecf8d23a51207ac"  # today's default clips: another experiment
    # the file such a run wrote before the change: today's file without the parameter it did not hold
    written = to_toml(from_dict(raw)).replace("params = { evidence_clip = 1 }", "params = {  }")
    assert "evidence_clip" not in written
    old_file = tmp_path / "config.toml"
    old_file.write_text(written)
    assert load_run_config(old_file).run_fingerprint() == "5ecf8d23a51207ac"


def test_a_neutral_key_enters_the_fingerprint_only_when_set():
    base = from_dict({}).run_fingerprint()
    assert from_dict({"data": {"label_column": "label"}}).run_fingerprint() == base
    assert from_dict({"data": {"label_column": "y"}}).run_fingerprint() != base
    assert from_dict({"eval": {"every_round_last": 0}}).run_fingerprint() == base
    assert from_dict({"eval": {"every_round_last": 5}}).run_fingerprint() != base


def test_unfingerprinted_keys_never_enter_it_and_fingerprinted_ones_always_do():
    base = from_dict({}).run_fingerprint()
    assert from_dict({"train": {"threads": 2}, "eval": {"tensorboard": True}}).run_fingerprint() == base
    assert from_dict({"train": {"lr": 0.05}}).run_fingerprint() != base


def test_a_changed_default_reads_old_run_files_as_they_ran(tmp_path):
    """``was`` on a field: a run file without the key ran with the old value and keeps its fingerprint."""
    assert CHANGED_DEFAULTS == {"guards.update_norm_clip": 0.0}
    old_file = tmp_path / "config.toml"
    old_file.write_text('[method]\nname = "fedavg"\n')
    old = load_run_config(old_file)
    assert old.guards.update_norm_clip == 0.0
    assert (
        old.run_fingerprint()
        == from_dict({"method": {"name": "fedavg"}})
        .copy(**{"guards.update_norm_clip": 0.0})
        .run_fingerprint()
    )
    assert from_dict({}).guards.update_norm_clip == 2.0  # today's default: another experiment


def test_neutral_with_was_leaves_out_the_old_value_not_the_default():

    @dataclasses.dataclass
    class Section:
        clip: float = neutral(2.0, was=0.0)

    (field,) = dataclasses.fields(Section)
    assert field.default == 2.0 and field.metadata["neutral_value"] == 0.0 and field.metadata["was"] == 0.0
