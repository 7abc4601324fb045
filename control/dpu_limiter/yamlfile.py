"""Reading the YAML files users write (manifests, topologies, scenarios), with errors that name the file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


class YamlFileError(ValueError):
    """The file cannot be read or is not valid YAML; the message names the file."""


def read_yaml(path: Path) -> Any:
    """The parsed document of a YAML file."""
    try:
        return yaml.safe_load(path.read_text())
    except OSError as exc:
        raise YamlFileError(f"{path}: cannot read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise YamlFileError(f"{path}: not valid YAML: {exc}") from None
