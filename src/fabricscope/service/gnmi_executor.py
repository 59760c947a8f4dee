"""The live backend of :class:`~fabricscope.diagnosis.actions.Executor`: allowed actions as
gNMI Set requests (gNMI spec 3.4) to the switches a collector config names.

``cost-out-link`` disables one switch end of the cable the root cause names
(``/interfaces/interface[name=PORT]/config/enabled`` false, OpenConfig
openconfig-interfaces): the link goes down, routing drains it, and the frame errors, probe
loss or queues it caused stop. It is reversible (the undo sets ``enabled`` true) and it is
what an operator does first on a gray or flapping link in a Clos fabric with ECMP. The switch
end chosen is the first of the cable's ends that is a switch a configured target serves (a
host NIC is no gNMI target). ``shift-lb-weight`` and ``restart-agent`` have no standard
OpenConfig leaf and are refused (:meth:`GnmiExecutor.supports`).

The targets, their addresses, credentials and TLS come from a ``gnmi collect`` config
(:func:`fabricscope.telemetry.config.load_config`), so the console acts with the same
identity its collector reads with. Every Set is logged (without the password) and kept in
``done`` with its undo.
"""

from __future__ import annotations

import logging

import grpc
from gnmi_pb import gnmi_pb2, gnmi_pb2_grpc

from fabricscope.diagnosis.actions import ActionResult
from fabricscope.diagnosis.graph import ResourceMap
from fabricscope.fabric.inventory import Fabric, port_device
from fabricscope.telemetry.codec import to_proto_path
from fabricscope.telemetry.collector import auth_metadata, tls_credentials
from fabricscope.telemetry.config import CollectorConfig, TargetConfig
from fabricscope.telemetry.paths import parse_path

__all__ = ["GnmiExecutor"]

log = logging.getLogger("fabricscope.actions.gnmi")


class GnmiExecutor:
    """Executes ``cost-out-link`` as a gNMI Set on the switch (module doc)."""

    def __init__(self, fabric: Fabric, cfg: CollectorConfig, *, timeout_s: float = 10.0) -> None:
        self.fabric = fabric
        self.cfg = cfg
        self.timeout_s = timeout_s
        self.rmap = ResourceMap(fabric)
        self.by_device: dict[str, TargetConfig] = {}
        for t in cfg.targets:
            auth_metadata(cfg, t)  # a missing password variable fails now, not at the first action
            for name in t.names or (t.name,):
                self.by_device.setdefault(name, t)
        self.done: list[ActionResult] = []
        self._set_ports: dict[str, str] = {}  # cable -> the switch port disabled for it

    def supports(self, automation: str) -> bool:
        """Whether ``automation`` can be carried out (``cost-out-link`` only)."""
        return automation == "cost-out-link"

    def execute(self, automation: str, resource: str) -> ActionResult:
        """Cost out the cable ``resource`` names (a cable, a port or a direction of it)."""
        if not self.supports(automation):
            res = ActionResult(automation, resource, False,
                               f"{automation}: no gNMI leaf carries it out (not supported)")
        else:
            res = self._cost_out(automation, resource)
        self.done.append(res)
        return res

    def _switch_end(self, resource: str) -> tuple[str, str] | str:
        """(cable, switch port) to disable, or why there is none."""
        ports = self.rmap.ports_of_subject(resource)
        cables = self.rmap.resources(resource, "cable") if ports else ()
        if not cables:
            return f"{resource}: names no cable, port or direction of one"
        cable = cables[0]
        ends = cable.split("|")
        # the port the root cause names first, then the cable's other end
        for p in [*(q for q in ports if q in ends), *ends]:
            dev = port_device(p)
            d = self.fabric.devices.get(dev)
            if d is not None and d.role != "host" and dev in self.by_device:
                return cable, p
        return f"{cable}: neither end is a switch the collector config serves"

    def _cost_out(self, automation: str, resource: str) -> ActionResult:
        end = self._switch_end(resource)
        if isinstance(end, str):
            return ActionResult(automation, resource, False, end)
        cable, port = end
        failed = self._set_enabled(port, False)
        dev, _, name = port.rpartition(":")
        path = f"/interfaces/interface[name={name}]/config/enabled"
        where = f"{dev} ({self.by_device[dev].address})"
        if failed:
            return ActionResult(automation, cable, False, f"gNMI Set {path} = false on {where} failed: {failed}")
        self._set_ports[cable] = port
        log.warning("gNMI Set %s = false on %s: %s costed out", path, where, cable)
        return ActionResult(automation, cable, True,
                            f"gNMI Set {path} = false on {where}: {cable} is down and drained",
                            undo=f"gNMI Set {path} = true on {dev}")

    def revert(self, done: ActionResult) -> ActionResult:
        """Undo an executed cost-out: ``config/enabled`` true on the port it disabled."""
        port = self._set_ports.get(done.resource) if done.ok else None
        if done.automation != "cost-out-link" or port is None:
            return ActionResult(done.automation, done.resource, False,
                                f"{done.automation} on {done.resource}: nothing to undo")
        dev, _, name = port.rpartition(":")
        path = f"/interfaces/interface[name={name}]/config/enabled"
        failed = self._set_enabled(port, True)
        if failed:
            return ActionResult("cost-in-link", done.resource, False,
                                f"gNMI Set {path} = true on {dev} failed: {failed}")
        del self._set_ports[done.resource]
        log.warning("gNMI Set %s = true on %s: %s back in service", path, dev, done.resource)
        return ActionResult("cost-in-link", done.resource, True,
                            f"gNMI Set {path} = true on {dev}: {done.resource} is back in service")

    def _set_enabled(self, port: str, enabled: bool) -> str:
        """Set the port's ``config/enabled``; "" on success, else the gRPC error."""
        dev, _, name = port.rpartition(":")
        t = self.by_device[dev]
        path = f"/interfaces/interface[name={name}]/config/enabled"
        req = gnmi_pb2.SetRequest(prefix=gnmi_pb2.Path(target=dev), update=[gnmi_pb2.Update(
            path=to_proto_path(parse_path(path)), val=gnmi_pb2.TypedValue(bool_val=enabled))])
        try:
            with self._channel(t) as ch:
                gnmi_pb2_grpc.gNMIStub(ch).Set(req, metadata=auth_metadata(self.cfg, t),
                                               timeout=self.timeout_s)
        except grpc.RpcError as exc:
            code = exc.code().name if hasattr(exc, "code") else "ERROR"
            why = exc.details() if hasattr(exc, "details") else str(exc)
            log.warning("gNMI Set %s = %s on %s (%s) failed: %s %s", path, enabled, dev, t.address, code, why)
            return f"{code}: {why}"
        return ""

    def _channel(self, t: TargetConfig) -> grpc.Channel:
        tls = tls_credentials(t)
        if tls is None:
            return grpc.insecure_channel(t.address)
        return grpc.secure_channel(t.address, tls[0], options=tls[1])
