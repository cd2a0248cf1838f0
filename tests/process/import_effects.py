"""A stage module whose import misbehaves in a template process only (for tests/process/test_template.py).

``$OT_TEST_TEMPLATE_IMPORT`` says how: ``thread`` starts a thread (a template must not fork
then), ``exit`` ends the template before it is ready, ``hang`` blocks its import for a minute.
The caller and the workers, which import this module too, are left alone.
"""

from __future__ import annotations

import os
import sys
import threading
import time

from omni_trio import SimpleScheduler, StagePayload


def _in_template() -> bool:
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return spec is not None and spec.name == "omni_trio.runtime.workers.template_main"


if _in_template():
    _effect = os.environ.get("OT_TEST_TEMPLATE_IMPORT")
    if _effect == "thread":
        threading.Thread(target=threading.Event().wait, daemon=True).start()
    elif _effect == "exit":
        os._exit(3)
    elif _effect == "hang":
        time.sleep(60)


def create_noisy(marker: str) -> SimpleScheduler:
    """Writes ``<marker> <pid>`` to stderr when built; then passes payloads on, adding its pid."""
    print(f"{marker} {os.getpid()}", file=sys.stderr, flush=True)

    def fn(payload: StagePayload) -> StagePayload:
        payload.data = {"pid": os.getpid()}
        return payload

    return SimpleScheduler(fn)
