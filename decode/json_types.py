"""The type of a JSON document: what goes to disk (artifact headers, manifests, results) as it is written.

Code that reads such a document back goes through a typed record (:mod:`decode.metadata`,
``data_gen.manifest.CollectionManifest``, …); these aliases name only the document itself.
"""

from __future__ import annotations

from typing import Union

JSON = Union[None, bool, int, float, str, list["JSON"], dict[str, "JSON"]]
#: A JSON object: what ``json.loads`` of a document returns and ``json.dumps`` writes.
JSONDict = dict[str, JSON]
