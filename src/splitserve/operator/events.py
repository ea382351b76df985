"""Kubernetes Events on an `LLMService`: decisions, flip steps, failures (`kubectl describe`).

`core/v1` Events, as client-go's recorder writes them: the same (reason, message) on the same
object is one Event whose `count` and `lastTimestamp` move, so a failure repeated by a retry
does not flood the namespace. Posting never fails a reconcile: an Event the API server refuses
(no RBAC for events, quota) is logged once and dropped.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Mapping
from typing import Any, Final, Literal

from splitserve.operator.kube import Kube, KubeError

log = logging.getLogger(__name__)

COMPONENT: Final = "splitserve-operator"
MAX_MESSAGE: Final = 1024

EventType = Literal["Normal", "Warning"]


class Recorder:
    """Posts Events; remembers what it posted (name -> count) to bump repeats with one patch."""

    def __init__(self, component: str = COMPONENT) -> None:
        self.component = component
        self._counts: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()
        self._refused = False

    def remembered(self) -> int:
        """How many distinct Events it remembers."""
        with self._lock:
            return len(self._counts)

    def forget(self, namespace: str, name: str) -> None:
        """A deleted object: drop what it remembers of the object's Events (named
        `<name>.<16 hex digits>`)."""
        with self._lock:
            for key in [k for k in self._counts if k[0] == namespace]:
                if key[1].rsplit(".", 1)[0] == name:
                    del self._counts[key]

    def post(
        self,
        kube: Kube,
        involved: Mapping[str, Any],
        type_: EventType,
        reason: str,
        message: str,
        now: str,
    ) -> None:
        md = involved["metadata"]
        namespace = str(md["namespace"])
        message = message[:MAX_MESSAGE]
        digest = hashlib.sha256(f"{md.get('uid')}|{type_}|{reason}|{message}".encode()).hexdigest()
        name = f"{md['name']}.{digest[:16]}"
        key = (namespace, name)
        with self._lock:
            count = self._counts.get(key, 0) + 1
            self._counts[key] = count
        try:
            if count > 1:
                patch = {"count": count, "lastTimestamp": now}
                try:
                    kube.patch("v1", "Event", namespace, name, patch)
                    return
                except KubeError as err:
                    if err.status != 404:  # expired (events live an hour): post it again
                        raise
            event = {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"name": name, "namespace": namespace},
                "involvedObject": {
                    "apiVersion": involved["apiVersion"],
                    "kind": involved["kind"],
                    "name": md["name"],
                    "namespace": namespace,
                    "uid": md.get("uid"),
                },
                "type": type_,
                "reason": reason,
                "message": message,
                "source": {"component": self.component},
                "firstTimestamp": now,
                "lastTimestamp": now,
                "count": count,
            }
            try:
                kube.create(event)
            except KubeError as err:
                if err.status != 409:  # posted by an operator before a restart
                    raise
                kube.patch("v1", "Event", namespace, name, {"count": count, "lastTimestamp": now})
        except KubeError as err:
            if not self._refused:
                log.warning("cannot post Events (%s); continuing without them", err)
                self._refused = True
