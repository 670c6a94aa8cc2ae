"""The second process of ``test_decorator.py``'s concurrency test: runs
``decorated_payment.burst`` for ``order_id`` with ``tasks`` asyncio tasks of
``calls_per_task`` calls each, starting at ``start_at`` (wall-clock seconds), and prints
``{"calls": [...provider keys its function bodies got], "ids": [...payment ids answered],
"errors": [...class names]}`` as JSON.

    python decorated_worker.py ORDER_ID TASKS CALLS_PER_TASK START_AT
"""

from __future__ import annotations

import asyncio
import json
import sys

import decorated_payment


def main() -> None:
    order_id, tasks, calls, start_at = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    answers = asyncio.run(decorated_payment.burst(order_id, tasks, calls, start_at))
    print(
        json.dumps(
            {
                "calls": decorated_payment.CALLS,
                "ids": [a["id"] for a in answers if isinstance(a, dict)],
                "errors": [type(a).__name__ for a in answers if not isinstance(a, dict)],
            }
        )
    )


if __name__ == "__main__":
    main()
