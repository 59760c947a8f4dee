"""``preflight --fix``: apply only reversible settings, after writing an undo script.

Reversible: sysctl values, transparent huge pages, the CPU governor, NIC IRQ affinity (file
writes under the host root) and NIC ring sizes (``ethtool -G``, run only on the real host).
Everything else is refused with the reason (firmware, link speed, MTU, boot parameters...).
The undo script is plain POSIX ``sh``, written and flushed *before* the first change, with the
exact previous value of every setting, restoring in reverse order. Runtime changes do not
survive a reboot; persisting them (``/etc/sysctl.d``, tuned profiles) is left to the operator.
"""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from fabricscope.model.errors import TransportError
from fabricscope.preflight.checks import CheckResult, FixAction

#: Why a setting of this kind is not changed by ``--fix``.
REFUSED = {
    "nic.firmware": "firmware flashing is not reversible from here; use the vendor tool "
                    "(mlxfwmanager) in a maintenance window",
    "nic.speed": "link speed is negotiated with the switch; check cable, optics and port",
    "nic.mtu": "MTU must match the switch ports and every peer; change the network config",
    "nic.operstate": "bringing a link up changes routing; do it deliberately",
    "irqbalance": "stopping a service is left to the operator (systemctl)",
    "hugepages": "reserving huge pages takes memory from running jobs",
    "iommu": "needs a kernel command-line change and a reboot",
}

#: Runs one command (argv); raises OSError / CalledProcessError on failure.
CommandRunner = Callable[[Sequence[str]], None]


class FixError(TransportError):
    """A change could not be applied; the message says how many were and where the undo is."""


@dataclass
class FixPlan:
    """What ``--fix`` would do: (result, actions) to apply and (result, reason) refused."""

    apply: list[tuple[CheckResult, tuple[FixAction, ...]]] = field(default_factory=list)
    refused: list[tuple[CheckResult, str]] = field(default_factory=list)

    @property
    def actions(self) -> list[FixAction]:
        """Every action in application order."""
        return [a for _, acts in self.apply for a in acts]


def plan_fixes(results: Sequence[CheckResult], *, allow_commands: bool) -> FixPlan:
    """Split warn / fail results into reversible changes and refusals (with reasons).

    ``allow_commands`` is False for a fixture root: ``ethtool -G`` would change the real
    machine's NIC, not the tree.
    """
    plan = FixPlan()
    for r in results:
        if r.status not in ("warn", "fail"):
            continue
        if not r.reversible:
            base = r.check if r.check in REFUSED else r.check.split(".")[0]
            plan.refused.append((r, REFUSED.get(base, "not a reversible setting")))
        elif not r.actions:
            plan.refused.append((r, r.reason or "no reversible change known"))
        elif r.reason and r.check.endswith("tcp_congestion_control"):
            plan.refused.append((r, r.reason))
        elif any(a.command for a in r.actions) and not allow_commands:
            plan.refused.append((r, "commands (ethtool -G) run only on the real host (--root /)"))
        else:
            plan.apply.append((r, r.actions))
    return plan


def _root_prefix(root: str) -> str:
    return "" if str(Path(root)) == "/" else str(Path(root).resolve())


def undo_script(plan: FixPlan, *, root: str, hostname: str, written_at: str) -> str:
    """The POSIX sh text restoring every previous value of ``plan``, last change first."""
    lines = ["#!/bin/sh",
             f"# fabricscope preflight undo for {hostname}, written {written_at} before "
             f"applying {len(plan.actions)} change(s).",
             "# Restores each previous value, last change first. Run: sh THIS_FILE",
             "status=0",
             f"ROOT={shlex.quote(_root_prefix(root))}"]
    for a in reversed(plan.actions):
        if a.command:
            cmd = " ".join(shlex.quote(x) for x in a.undo)
            lines.append(f"{cmd} || {{ echo 'undo failed: {cmd}' >&2; status=1; }}")
        else:
            target = f'"$ROOT"/{shlex.quote(a.path)}'
            lines.append(f"printf '%s\\n' {shlex.quote(a.previous)} > {target} || "
                         f"{{ echo 'undo failed: /{a.path}' >&2; status=1; }}")
    lines.append("exit $status")
    return "\n".join(lines) + "\n"


def _run(argv: Sequence[str]) -> None:
    subprocess.run(list(argv), check=True, capture_output=True, timeout=10)


def apply_fixes(plan: FixPlan, *, root: str, undo_path: Path, hostname: str, written_at: str,
                run_command: CommandRunner = _run) -> int:
    """Write the undo script to ``undo_path``, then apply every action; returns how many.

    File actions write ``value`` + newline to ``ROOT/path`` (a real write, also in a fixture
    tree). Stops at the first failure with :class:`FixError` naming the setting, how many
    changes were applied and the undo script.
    """
    text = undo_script(plan, root=root, hostname=hostname, written_at=written_at)
    try:
        with open(undo_path, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
        undo_path.chmod(0o755)
    except OSError as exc:
        raise FixError(f"--undo-script: {undo_path}: cannot write ({exc.strerror}); "
                       "nothing changed") from None
    base = Path(root)
    done = 0
    for a in plan.actions:
        try:
            if a.command:
                run_command(a.command)
            else:
                with open(base / a.path, "w", encoding="utf-8") as fh:
                    fh.write(a.value + "\n")
        except (OSError, subprocess.SubprocessError) as exc:
            what = " ".join(a.command) if a.command else f"/{a.path}"
            why = getattr(exc, "strerror", None) or type(exc).__name__
            raise FixError(f"fix: {what}: {why} (root needed?); {done} of {len(plan.actions)} "
                           f"change(s) applied; undo with: sh {undo_path}") from None
        done += 1
    return done
