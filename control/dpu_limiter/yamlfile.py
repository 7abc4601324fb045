"""Reading the YAML files users write (manifests, topologies, scenarios, sweeps): the one loader for all of them.

It reads what a control plane or a lab needs and refuses the rest with a short message naming the file and,
once the text is decoded, the line and column:
- at most MAX_FILE_BYTES (so /dev/zero, an endless pipe or a huge file stop there), as UTF-8;
- no key twice in a mapping (YAML forbids it; PyYAML would keep the last silently), `<<` merges aside;
- at most MAX_DEPTH levels of nesting and MAX_NODES nodes, both counting what aliases repeat: an alias
  weighs what it names, so a 400-byte "billion laughs" is refused while it is read, not after it has
  been expanded by whoever walks the result; an alias inside the node it names is refused too;
- integers of at most MAX_INT_CHARS characters, and values the safe constructors take (a timestamp such as
  2023-02-30 is refused with its place rather than raised as a bare ValueError).
Aliases and merges within those limits load as before, with PyYAML's safe types.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.error import MarkedYAMLError
from yaml.events import AliasEvent
from yaml.nodes import MappingNode, Node, ScalarNode
from yaml.parser import Parser
from yaml.reader import Reader, ReaderError
from yaml.resolver import Resolver
from yaml.scanner import Scanner

from .models import cut

MAX_FILE_BYTES = 16 * 2**20  # 16 MiB; far above any manifest or scenario (MAX_NODES usually bites first)
MAX_DEPTH = 64  # levels of nesting; the shipped files use under 10
MAX_NODES = 1_000_000  # scalars, sequences and mappings, aliases counted as what they repeat (~0.4 GB parsed)
MAX_INT_CHARS = 100  # an integer's text: a rate or a byte count needs 20 at most

_MERGE_TAG = "tag:yaml.org,2002:merge"
_VALUE_TAG = "tag:yaml.org,2002:value"


class YamlFileError(ValueError):
    """The file cannot be read or is not valid YAML; the message names the file and where in it."""


class _Refused(MarkedYAMLError):
    """Valid YAML this loader does not take (a limit, a duplicate key); its problem is the whole message."""

    def __init__(self, problem: str, mark: Any) -> None:  # yaml.error.Mark, or libyaml's
        super().__init__(problem=problem, problem_mark=mark)


class _Guarded(Composer, SafeConstructor, Resolver):
    """Composition with the limits above, then PyYAML's safe construction; mixed with either parser."""

    peek_event: Callable[[], Any]  # the parser's

    def __init__(self) -> None:
        Composer.__init__(self)
        SafeConstructor.__init__(self)
        Resolver.__init__(self)
        self._level = 0  # the level of the node being composed (the root's is 1)
        self._deepest = 0  # the deepest level reached inside it, counting what aliases repeat
        self._nodes = 0  # nodes composed so far, counting what aliases repeat
        self._extent: dict[Node, tuple[int, int]] = {}  # an anchored node's (nodes, levels) once composed

    def _count(self, nodes: int, reach: int, mark: Any) -> None:
        self._nodes += nodes
        if reach > MAX_DEPTH:
            raise _Refused(f"nested deeper than {MAX_DEPTH} levels (counting what aliases repeat)", mark)
        if self._nodes > MAX_NODES:
            raise _Refused(f"more than {MAX_NODES} nodes once aliases are expanded", mark)
        self._deepest = max(self._deepest, reach)

    def compose_document(self) -> Node | None:  # type: ignore[override]
        self._nodes, self._extent = 0, {}
        return super().compose_document()

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:  # type: ignore[override]
        event = self.peek_event()
        if isinstance(event, AliasEvent):
            target = self.anchors.get(event.anchor)
            if target is not None:  # an undefined one is the composer's error
                extent = self._extent.get(target)
                if extent is None:
                    raise _Refused(f"alias *{cut(str(event.anchor))} inside the node it names", event.start_mark)
                self._count(extent[0], self._level + extent[1], event.start_mark)
            return super().compose_node(parent, index)
        level = self._level + 1
        before, outer = self._nodes, self._deepest
        self._count(1, level, event.start_mark if event is not None else None)
        self._level = self._deepest = level
        node = super().compose_node(parent, index)
        self._level = level - 1
        if node is not None and getattr(event, "anchor", None) is not None:
            self._extent[node] = (self._nodes - before, self._deepest - level + 1)
        self._deepest = max(outer, self._deepest)
        return node

    def compose_mapping_node(self, anchor: Any) -> MappingNode:
        node = super().compose_mapping_node(anchor)
        first: dict[Any, Node] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, ScalarNode):
                continue  # a collection as a key: the constructor refuses it (unhashable)
            if key_node.tag == _MERGE_TAG:
                key: Any = ("<<",)
            elif key_node.tag == _VALUE_TAG:
                key = key_node.value
            else:  # as the constructor reads it, so `1` and `0x1` are one key, as in the dict they make
                key = self.construct_object(key_node)
            try:
                seen = first.setdefault(key, key_node)
            except TypeError:
                continue
            if seen is not key_node:
                shown = "'<<'" if key == ("<<",) else cut(repr(key))
                line = seen.start_mark.line + 1
                raise _Refused(f"duplicate key {shown} (first at line {line})", key_node.start_mark)
        return node

    def construct_object(self, node: Any, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        except (ValueError, OverflowError, TypeError) as exc:  # e.g. a timestamp such as 2023-02-30
            raise _Refused(f"cannot read {node.tag} value: {cut(str(exc))}", node.start_mark) from None

    def construct_yaml_int(self, node: ScalarNode) -> int:
        if len(node.value) > MAX_INT_CHARS:
            raise _Refused(f"integer of {len(node.value)} characters (at most {MAX_INT_CHARS})", node.start_mark)
        return super().construct_yaml_int(node)


_Guarded.add_constructor("tag:yaml.org,2002:int", _Guarded.construct_yaml_int)  # type: ignore[type-var]


class PyLoader(Reader, Scanner, Parser, _Guarded):
    """The loader on PyYAML's own parser."""

    def __init__(self, stream: str) -> None:
        Reader.__init__(self, stream)
        Scanner.__init__(self)
        Parser.__init__(self)
        _Guarded.__init__(self)


try:
    from yaml._yaml import CParser
except ImportError:  # PyYAML built without libyaml
    CLoader: type | None = None
else:

    class _CLoader(_Guarded, CParser):
        """The loader on libyaml's parser (about 4 times faster); composing stays in Python, with the limits."""

        def __init__(self, stream: str) -> None:
            CParser.__init__(self, stream)
            _Guarded.__init__(self)

    CLoader = _CLoader


def read_yaml(path: Path) -> Any:
    """The parsed document of a YAML file, within the limits above; YamlFileError names the file and where."""
    try:
        with path.open("rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise YamlFileError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if len(data) > MAX_FILE_BYTES:
        limit = f"{MAX_FILE_BYTES} bytes" + (f" ({MAX_FILE_BYTES >> 20} MiB)" if MAX_FILE_BYTES % 2**20 == 0 else "")
        raise YamlFileError(f"{path}: larger than {limit}; not read further")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise YamlFileError(
            f"{path}:{line}: not UTF-8: byte 0x{data[exc.start]:02x} at offset {exc.start} ({exc.reason})"
        ) from None
    loader_class = CLoader or PyLoader
    loader = None
    try:
        loader = loader_class(text)
        return loader.get_single_data()
    except yaml.YAMLError as exc:
        raise YamlFileError(_message(path, text, exc, byte_offsets=loader_class is not PyLoader)) from None
    except RecursionError:  # not expected: nesting is bounded while composing
        raise YamlFileError(f"{path}: nested too deeply") from None
    finally:
        if loader is not None:
            loader.dispose()


def _message(path: Path, text: str, exc: yaml.YAMLError, byte_offsets: bool) -> str:
    """A parser's error as one short line: FILE:LINE:COL: what."""
    if isinstance(exc, ReaderError):  # a character YAML does not allow; libyaml counts bytes, PyYAML characters
        before = text.encode()[: exc.position].decode(errors="ignore") if byte_offsets else text[: exc.position]
        line, col = before.count("\n") + 1, len(before) - before.rfind("\n")
        what = f"#x{exc.character:04x}" if isinstance(exc.character, int) else repr(exc.character)
        return f"{path}:{line}:{col}: not valid YAML: unacceptable character {what}: {cut(str(exc.reason))}"
    if not isinstance(exc, MarkedYAMLError):
        return f"{path}: not valid YAML: {cut(str(exc))}"
    mark = exc.problem_mark or exc.context_mark
    where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
    if isinstance(exc, _Refused):
        return f"{where}: {exc.problem}"
    if exc.problem == "exceeded maximum nesting depth":  # libyaml's own limit (1000), met while scanning ahead
        return f"{where}: nested deeper than {MAX_DEPTH} levels"
    parts = [cut(exc.problem)] if exc.problem else []
    if exc.context:
        at = exc.context_mark
        parts.append(cut(exc.context) + (f" at line {at.line + 1}" if at is not None and at is not mark else ""))
    return f"{where}: not valid YAML: {'; '.join(parts)}"
