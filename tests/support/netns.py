"""Hosts on a real network for tests: Linux network namespaces joined by veth pairs and a bridge.

Each :class:`Host` is a network namespace with one interface on a private
subnet of its own (``SUBNET``), plugged into one bridge in the machine's own
namespace; the bridge has an address too, so the test process reaches every
host as a client would reach a cluster. Nothing in the namespaces has a route
beyond that subnet. A process started with :meth:`Host.command` also gets a
UTS namespace of its own with the host's name, so ``socket.gethostname()``
tells the hosts apart as it does on real machines, and every host resolves
every host's name (``/etc/netns/<namespace>/hosts``, which ``ip netns exec``
puts over ``/etc/hosts``): gloo picks the address it listens on from its hostname.

Cutting a host's link (:meth:`Host.cut`) takes its bridge-side veth down: the
host keeps its interface and address, and every packet to or from it is lost,
as when a cable or a switch port fails. No connection is reset.

Needs root and iproute2's ``ip``; :func:`unavailable` says why not when it can't run.
One network at a time on a machine: a lock file serialises the tests that use it.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["SUBNET", "Host", "Network", "unavailable"]

# A private range of our own; only the namespaces below and the bridge ever hold its addresses.
SUBNET = "10.213.0"
BRIDGE = "rayprofbr0"
BRIDGE_IP = f"{SUBNET}.254"
PREFIX_LEN = 24
NETNS_PREFIX = "rayprof-"
ETC_NETNS = Path("/etc/netns")
LOCK_FILE = "/tmp/rayprof-netns.lock"
LOCK_WAIT_S = 600.0
KILL_WAIT_S = 30.0


def unavailable() -> str | None:
    """Why network namespaces can't be made here, or ``None`` when they can."""
    if os.geteuid() != 0:
        return "needs root to make network namespaces (ip netns)"
    for tool in ("ip", "unshare", "hostname"):
        if shutil.which(tool) is None:
            return f"needs `{tool}` (iproute2 / util-linux) to make network namespaces"
    return None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
    return done


@dataclass(frozen=True)
class Host:
    """One host: a network namespace ``netns`` at ``ip``, named ``name``, linked to the bridge by ``link``."""

    name: str
    ip: str
    netns: str
    link: str

    def command(self, argv: list[str]) -> list[str]:
        """``argv`` run on this host: in its network namespace, with its hostname."""
        set_name = 'hostname "$0" && exec "$@"'
        return ["ip", "netns", "exec", self.netns, "unshare", "--uts", "sh", "-c", set_name, self.name, *argv]

    def cut(self) -> None:
        """Every packet to and from this host is lost from now on."""
        _ip("link", "set", self.link, "down")

    def restore(self) -> None:
        _ip("link", "set", self.link, "up")

    def pids(self) -> list[int]:
        """Every process in this host's network namespace: all of them were started by the test."""
        done = _ip("netns", "pids", self.netns, check=False)
        return [int(p) for p in done.stdout.split()]

    def kill_all(self) -> None:
        """SIGKILL every process on this host, and wait (bounded) until they are gone."""
        deadline = time.monotonic() + KILL_WAIT_S
        while (pids := self.pids()) and time.monotonic() < deadline:
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.2)


class Network:
    """A bridge and one namespace per name in ``names``; addresses ``SUBNET.1``, ``.2``, ... in that order.

    Use as a context manager: on exit every process on the hosts is killed and
    the namespaces, veths and bridge are deleted, whatever happened inside.
    """

    def __init__(self, names: list[str]) -> None:
        self.hosts = {
            name: Host(name, f"{SUBNET}.{i}", f"{NETNS_PREFIX}{name}", f"rayprofv{i}") for i, name in enumerate(names, 1)
        }
        self._lock = None

    def __enter__(self) -> Network:
        self._lock = open(LOCK_FILE, "w")  # noqa: SIM115 - held until __exit__
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    self._lock.close()
                    raise TimeoutError(f"another test held {LOCK_FILE} for {LOCK_WAIT_S:g}s") from None
                time.sleep(1)
        try:
            self._teardown()  # what a run killed before its cleanup left behind
            self._build()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self._teardown()
        finally:
            if self._lock is not None:
                self._lock.close()  # releases the lock
                self._lock = None

    def _build(self) -> None:
        _ip("link", "add", BRIDGE, "type", "bridge")
        _ip("addr", "add", f"{BRIDGE_IP}/{PREFIX_LEN}", "dev", BRIDGE)
        _ip("link", "set", BRIDGE, "up")
        names = "".join(f"{h.ip} {h.name}\n" for h in self.hosts.values())
        for host in self.hosts.values():
            etc = ETC_NETNS / host.netns
            etc.mkdir(parents=True)
            (etc / "hosts").write_text(f"127.0.0.1 localhost\n{names}")
            (etc / "resolv.conf").write_text("")  # no name server: nothing is reachable beyond the subnet
            _ip("netns", "add", host.netns)
            _ip("link", "add", host.link, "type", "veth", "peer", "name", "eth0", "netns", host.netns)
            _ip("link", "set", host.link, "master", BRIDGE)
            _ip("link", "set", host.link, "up")
            inside = ["-n", host.netns]
            _ip(*inside, "link", "set", "lo", "up")
            _ip(*inside, "addr", "add", f"{host.ip}/{PREFIX_LEN}", "dev", "eth0")
            _ip(*inside, "link", "set", "eth0", "up")

    def _teardown(self) -> None:
        for host in self.hosts.values():
            if _ip("netns", "pids", host.netns, check=False).returncode == 0:
                host.kill_all()
                _ip("netns", "delete", host.netns, check=False)
            _ip("link", "delete", host.link, check=False)  # deletes its peer too
            shutil.rmtree(ETC_NETNS / host.netns, ignore_errors=True)
        try:
            ETC_NETNS.rmdir()  # only when no one else's namespace has files there
        except OSError:
            pass
        _ip("link", "delete", BRIDGE, check=False)
