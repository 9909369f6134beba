"""Site presets: small TOML files of template option values, opt-in with ``--preset NAME``.

A preset is a ``description`` and a ``[job]`` table whose keys are template option keys (see
:data:`~.options.TEMPLATE_OPTIONS`; ``-`` and ``_`` are interchangeable). Flags beat presets, presets
beat defaults. The shipped presets live in ``presets/*.toml`` next to this module; a site can keep
its own file anywhere and pass its path (``--preset ./site.toml``).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from traceml_core.errors import ConfigError

from .options import BY_KEY

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python < 3.11 only
    import tomli as tomllib

PRESET_DIR = Path(__file__).with_name("presets")


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    values: dict[str, Any] = field(default_factory=dict)
    path: str = ""
    #: option keys the user must give (a container preset needs an image with traceml in it)
    requires: tuple[str, ...] = ()


def available() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.toml"))


def load(name: str) -> Preset:
    """Load a shipped preset by name, or a preset file by path (anything ending in ``.toml``)."""
    if name.endswith(".toml") or "/" in name:
        path = Path(name)
        if not path.is_file():
            raise ConfigError(f"--preset={name!r}: no such file. Give the path of a preset file, or one of the "
                              f"shipped presets: {', '.join(available())}.", variable="--preset")
        label = path.stem
    else:
        path = PRESET_DIR / f"{name}.toml"
        if not path.is_file():
            raise ConfigError(f"--preset={name!r} is not a shipped preset. Valid presets: "
                              f"{', '.join(available())} (or the path of your own .toml file).", variable="--preset")
        label = name
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"preset {path}: cannot be read as TOML ({exc}). Fix the file.", variable="--preset") from None
    return from_mapping(label, data, str(path))


def from_mapping(name: str, data: dict[str, Any], path: str = "") -> Preset:
    unknown_top = sorted(set(data) - {"description", "job", "requires"})
    if unknown_top:
        raise ConfigError(f"preset {name}: unknown top-level key(s) {', '.join(unknown_top)}. A preset has "
                          f"`description`, `requires` and a [job] table.", variable="--preset")
    requires = data.get("requires", [])
    if not isinstance(requires, list) or any(str(k).replace("-", "_") not in BY_KEY for k in requires):
        raise ConfigError(f"preset {name}: `requires` must be a list of option keys, from: "
                          f"{', '.join(sorted(BY_KEY))}.", variable="--preset")
    job = data.get("job", {})
    if not isinstance(job, dict):
        raise ConfigError(f"preset {name}: `job` must be a table ([job]).", variable="--preset")
    values: dict[str, Any] = {}
    for raw_key, value in job.items():
        key = raw_key.replace("-", "_")
        option = BY_KEY.get(key)
        if option is None:
            raise ConfigError(f"preset {name}: unknown option {raw_key!r}. Valid keys: "
                              f"{', '.join(sorted(BY_KEY))}.", variable="--preset")
        values[key] = _check_type(name, raw_key, option.kind, value)
    return Preset(name, str(data.get("description", "")), values, path,
                  tuple(str(k).replace("-", "_") for k in requires))


def _check_type(name: str, key: str, kind: str, value: Any) -> Any:
    if kind in ("bool", "tristate"):
        if not isinstance(value, bool):
            raise ConfigError(f"preset {name}: {key} must be true or false, not {value!r}.", variable="--preset")
        return value
    if kind == "list":
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"preset {name}: {key} must be a list of strings, for example [\"module load cuda\"].",
                              variable="--preset")
        return list(value)
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ConfigError(f"preset {name}: {key} must be a string or a number, not {value!r}.", variable="--preset")
    return str(value)
