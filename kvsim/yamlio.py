"""Reading YAML that a user hands kvsim, with bounds: one place for every user-facing YAML file
(scenario, sweep, generator spec, ``--set`` values, timing profiles).

PyYAML builds aliases as shared references, so an alias bomb (a "billion laughs" document of a few
hundred bytes whose aliases expand to ~10^9 nodes) parses in microseconds and then hangs whatever
walks the document as a tree (the non-finite check, variant merging, validation). The loader here
composes the node graph first and counts the nodes the document *expands* to, counting each alias
as the whole subtree it stands for, in time linear in the distinct nodes; a document over
:data:`MAX_EXPANDED_NODES`, or one whose alias refers back to itself (a recursive structure), is
refused before anything is constructed. A document nested deeper than Python's parser stack is
refused the same way. Every refusal is a one-line :class:`~kvsim.errors.ConfigError` naming the file.
"""

from __future__ import annotations

from typing import Any

import yaml

from kvsim.errors import ConfigError

# A scenario has a few hundred nodes; a 1,000-point sweep file of 20 keys each about 40,000. The
# bound keeps every later walk of the document well under a second (docs/scenario.md, "YAML").
MAX_EXPANDED_NODES = 500_000


class UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that rejects a key given twice in one mapping (PyYAML silently keeps the last)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


class _Refused(Exception):
    pass


class YAMLSyntaxError(ConfigError):
    """The text is not YAML (as against a well-formed document that is refused)."""


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def expanded_size(root: yaml.Node, limit: int = MAX_EXPANDED_NODES) -> int:
    """Nodes ``root`` stands for with every alias expanded (iterative, memoised per node object).
    Raises _Refused past ``limit`` or on a node that contains itself."""
    memo: dict[int, int] = {}
    open_nodes: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, closing = stack.pop()
        nid = id(node)
        if closing:
            open_nodes.discard(nid)
            total = 1 + sum(memo[id(c)] for c in _children(node))
            if total > limit:
                raise _Refused(f"the document expands to more than {limit:,} nodes "
                               f"(YAML aliases repeating a large subtree; write the values out)")
            memo[nid] = total
            continue
        if nid in memo:
            continue
        if nid in open_nodes:
            raise _Refused("a YAML alias refers to a node that contains it (a recursive structure)")
        open_nodes.add(nid)
        stack.append((node, True))
        stack.extend((c, False) for c in _children(node) if id(c) not in memo)
    return memo[id(root)]


def load_yaml(text: str, where: str, loader: type[yaml.SafeLoader] = UniqueKeyLoader) -> Any:
    """The document in ``text`` (None if empty), bounded as the module says; ``where`` names the file
    (or ``--set`` argument) in every error. A syntax error gives ``where:LINE:COL``."""
    ld = loader(text)
    try:
        node = ld.get_single_node()
        if node is None:
            return None
        expanded_size(node)
        return ld.construct_document(node)
    except _Refused as e:
        raise ConfigError(f"{where}: refused: {e}") from None
    except RecursionError:
        raise ConfigError(f"{where}: refused: the YAML document is nested too deeply") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f"{where}:{mark.line + 1}:{mark.column + 1}" if mark else where
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise YAMLSyntaxError(f"{at}: YAML syntax error: {problem}") from None
    finally:
        ld.dispose()
