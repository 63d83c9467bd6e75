"""Configuration: TOML round trip, validation errors that name the field, CLI-style overrides."""

from __future__ import annotations

import pytest

from fedhet.config import ExperimentConfig, apply_override, from_dict, load_config, parse_value, to_toml
from fedhet.errors import ConfigError


def test_defaults_round_trip_through_toml(tmp_path):
    cfg = ExperimentConfig()
    cfg.data.split_params = {"alpha": 0.05, "rare_classes": [0, 3]}
    cfg.method.params = {"warmup_fraction": 0.1, "per_class_baseline": True}
    cfg.train.local_steps = 5
    path = tmp_path / "c.toml"
    path.write_text(to_toml(cfg))
    back = load_config(path)
    assert back.to_dict() == cfg.to_dict()


@pytest.mark.parametrize(
    "raw, needle",
    [
        ({"data": {"datset": "x"}}, "datset"),
        ({"bogus": 1}, "bogus"),
        ({"train": {"rounds": 0}}, "train.rounds"),
        ({"train": {"lr": "fast"}}, "train.lr"),
        ({"train": {"optimizer": "rmsprop"}}, "rmsprop"),
        ({"train": {"clients_per_round": 1.5}}, "clients_per_round"),
        ({"data": {"validation_fraction": 1.0}}, "validation_fraction"),
        ({"eval": {"fairness": "maybe"}}, "eval.fairness"),
        ({"seed": -1}, "seed"),
        ({"data": {"split_params": 3}}, "split_params"),
        ({"train": {"lr": float("inf")}}, "train.lr=inf must be a finite number"),
        ({"train": {"weight_decay": float("nan")}}, "train.weight_decay=nan must be a finite number"),
        ({"train": {"local_epochs": float("inf")}}, "train.local_epochs=inf must be a finite number"),
        ({"train": {"clients_per_round": float("inf")}}, "train.clients_per_round=inf must be a finite"),
        ({"train": {"lr_min": -1e-3}}, "train.lr_min=-0.001 must be >= 0"),
        ({"train": {"lr_decay": -0.5}}, "train.lr_decay=-0.5 must be in (0, 1]"),
        ({"train": {"lr_decay": 0.0}}, "train.lr_decay=0.0 must be in (0, 1]"),
        # 2 clients, 95 % dropout: 0.1 replying clients per round on average
        ({"data": {"clients": 2}, "train": {"client_dropout": 0.95}}, "leaves 0.1 replying clients"),
        ({"data": {"clients": 10}, "train": {"clients_per_round": 0.2, "client_dropout": 0.6}}, "leaves 0.8"),
    ],
)
def test_invalid_values_name_the_field(raw, needle):
    with pytest.raises(ConfigError) as err:
        from_dict(raw)
    assert needle in str(err.value)


def test_unknown_key_lists_accepted_keys():
    with pytest.raises(ConfigError) as err:
        from_dict({"train": {"epochs": 3}})
    assert "local_epochs" in str(err.value)


def test_overrides_parse_literals_and_nested_tables():
    cfg = ExperimentConfig()
    apply_override(cfg, "data.split_params.alpha", "0.05")
    apply_override(cfg, "train.clients_per_round", "8")
    apply_override(cfg, "train.lr", "3")
    apply_override(cfg, "method.params.rare", "[0, 1]")
    apply_override(cfg, "data.split", "maverick")
    apply_override(cfg, "seed", "7")
    assert cfg.data.split_params == {"alpha": 0.05}
    assert cfg.train.clients_per_round == 8 and isinstance(cfg.train.clients_per_round, int)
    assert cfg.train.lr == 3.0 and isinstance(cfg.train.lr, float)
    assert cfg.method.params == {"rare": [0, 1]}
    assert cfg.data.split == "maverick" and cfg.seed == 7
    with pytest.raises(ConfigError, match="unknown key"):
        apply_override(cfg, "train.nope", "1")
    with pytest.raises(ConfigError, match="unknown section"):
        apply_override(cfg, "training.lr", "1")
    with pytest.raises(ConfigError, match="train.rounds"):
        apply_override(cfg, "train.rounds", "-3")


def test_parse_value():
    assert parse_value("0.5") == 0.5
    assert parse_value("true") is True
    assert parse_value("cosine") == "cosine"
    assert parse_value("[1, 2]") == [1, 2]
    assert parse_value("none") is None
    # more than one TOML line is not one value: kept whole as a string (then refused by a numeric field),
    # never read as 0.5 with the rest dropped
    assert parse_value("0.5\nx = 1") == "0.5\nx = 1"
    with pytest.raises(ConfigError, match="train.lr"):
        apply_override(ExperimentConfig(), "train.lr", "0.5\nx = 1")


def test_fingerprint_ignores_excluded_keys():
    a, b = ExperimentConfig(), ExperimentConfig()
    b.train.device = "cpu"
    assert a.fingerprint("train", exclude=("train.device",)) == b.fingerprint(
        "train", exclude=("train.device",)
    )
    b.train.lr = 0.01
    assert a.fingerprint("train", exclude=("train.device",)) != b.fingerprint(
        "train", exclude=("train.device",)
    )


def test_enough_replying_clients_with_dropout_is_accepted():
    from_dict({"data": {"clients": 10}, "train": {"client_dropout": 0.9}})  # 1.0 replying client per round
    from_dict({"data": {"clients": 4}, "train": {"clients_per_round": 2, "client_dropout": 0.5}})


def test_a_config_that_is_not_utf8_or_is_a_directory_is_a_clear_error(tmp_path):
    bad = tmp_path / "latin1.toml"
    bad.write_bytes('[data]\ndataset = "caf\u00e9"\n'.encode("latin-1"))
    with pytest.raises(ConfigError, match=r"latin1.toml is not UTF-8 text \(byte 21: b'\\xe9'\)"):
        load_config(bad)
    (tmp_path / "dir.toml").mkdir()
    with pytest.raises(ConfigError, match="dir.toml is a directory"):
        load_config(tmp_path / "dir.toml")


def test_overrides_are_applied_in_order_and_the_config_is_validated_once(monkeypatch):
    """A command line's flags and --set values build the config once (not once per value); a later value of
    the same key wins, and a bad one is still refused by name."""
    import fedhet.config as config_module

    built = []
    real = config_module.from_dict
    monkeypatch.setattr(config_module, "from_dict", lambda raw: built.append(1) or real(raw))
    cfg = ExperimentConfig()
    config_module.apply_overrides(
        cfg, [("train.rounds", "5"), ("data.split_params.alpha", "0.3"), ("train.rounds", 7), ("seed", 2)]
    )
    assert len(built) == 1
    assert (cfg.train.rounds, cfg.data.split_params, cfg.seed) == (7, {"alpha": 0.3}, 2)
    with pytest.raises(ConfigError, match="unknown key 'roundz' in \\[train\\]"):
        config_module.apply_overrides(cfg, [("train.lr", "0.05"), ("train.roundz", "3")])
    assert cfg.train.lr is None  # nothing applied from a refused line (unset: the model's default)
