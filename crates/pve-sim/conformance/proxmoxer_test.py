#!/usr/bin/env python3
"""Conformance check: drive the PVE simulator with proxmoxer, a client nobody here wrote.

Uses proxmoxer's HTTPS backend with API-token auth exactly as a user would, against a
running `proxops-pvesim` (run-proxmoxer.sh starts one and passes its address). Every step
is an assertion with a message; the last line is `N passed, N failed` (plus `, N skipped`
when a step was skipped). Exit status is non-zero when any step failed.

Expectations come from ../shared/pve-api/BEHAVIOUR.md and LIVE-FACTS.md (real PVE 9), never
from what the simulator happens to answer. A step the simulator is known to get wrong is
listed in KNOWN_SIMULATOR_DEFECTS with the reason, reported as SKIP and not hidden.

Environment:
  PVESIM_HOST      host:port of the simulator (required), e.g. 127.0.0.1:18006
  PVESIM_NODE      node to use (default pve1)
  PVESIM_USER      token owner (default root@pam)
  PVESIM_TOKEN_ID  token name (default proxops)
  PVESIM_TOKEN     token secret (default proxops-dev-secret)
  PVESIM_PASSWORD  password of the token owner, for the ticket step (default proxops)
"""

import hashlib
import http.server
import os
import re
import sys
import tempfile
import threading
import time
import traceback
import warnings

import proxmoxer
import urllib3
from proxmoxer import ProxmoxAPI, ResourceException
from proxmoxer.core import AuthenticationError
from proxmoxer.tools import Tasks

# verify_ssl=False is deliberate (self-signed simulator certificate); silence the warning.
urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
warnings.simplefilter("ignore", urllib3.exceptions.InsecureRequestWarning)

# step id -> (signature, reason). A step listed here still runs. If it fails with a message
# containing `signature` it is reported as SKIP with the reason (a known simulator defect,
# reported to the simulator's author, not hidden); any other failure is a FAIL; if it passes it
# counts as passed and a note says the entry can go. Each reason names the simulator behaviour
# that differs from real PVE and the evidence.
KNOWN_SIMULATOR_DEFECTS = {}

TASK_TIMEOUT = 60.0
UPID_RE = re.compile(
    r"^UPID:([a-zA-Z0-9]([a-zA-Z0-9\-]*[a-zA-Z0-9])?):([0-9A-Fa-f]{8}):([0-9A-Fa-f]{8,9}):"
    r"([0-9A-Fa-f]{8}):([^:\s/]+):([^:\s/]*):([^:\s/]+):$"
)
NET0_RE = re.compile(r"^virtio=((?:[0-9A-Fa-f]{2}:){5}[0-9A-Fa-f]{2}),bridge=vmbr0(,.*)?$")


class StepFailed(Exception):
    pass


def check(cond, msg):
    if not cond:
        raise StepFailed(msg)


class Runner:
    def __init__(self):
        self.passed = 0
        self.failed = 0
        self.skipped = 0
        self.ok = set()  # ids of passed steps

    def step(self, sid, name, fn, after=()):
        """Runs step `sid` if every step in `after` passed."""
        missing = [a for a in after if a not in self.ok]
        if missing:
            self._fail(sid, name, f"not run, needs step(s) {', '.join(missing)} which did not pass")
            return
        started = time.monotonic()
        try:
            fn()
        except StepFailed as e:
            self._fail(sid, name, str(e))
            return
        except ResourceException as e:
            self._fail(sid, name, f"unexpected API error: {e}")
            return
        except Exception as e:  # noqa: BLE001 - report anything, keep going
            self._fail(sid, name, f"{type(e).__name__}: {e}\n{traceback.format_exc()}")
            return
        self.passed += 1
        self.ok.add(sid)
        note = ""
        if sid in KNOWN_SIMULATOR_DEFECTS:
            note = " [listed as a known simulator defect but passed: remove it from the list]"
        print(f"PASS {name} ({time.monotonic() - started:.2f}s){note}", flush=True)

    def _fail(self, sid, name, msg):
        signature, reason = KNOWN_SIMULATOR_DEFECTS.get(sid, (None, None))
        if signature is not None and signature in msg:
            self.skipped += 1
            print(f"SKIP {name}: known simulator defect: {reason} "
                  f"(this run: {msg.splitlines()[0]})", flush=True)
            return
        self.failed += 1
        print(f"FAIL {name}: {msg}", flush=True)


def wait_task(api, node, upid, what):
    """Polls nodes(node).tasks(upid).status until stopped; returns the final status."""
    check(isinstance(upid, str) and UPID_RE.match(upid), f"{what}: expected a UPID, got {upid!r}")
    deadline = time.monotonic() + TASK_TIMEOUT
    seen_running = False
    while True:
        st = api.nodes(node).tasks(upid).status.get()
        check(isinstance(st, dict), f"{what}: task status is not an object: {st!r}")
        check(st.get("upid") == upid, f"{what}: task status upid {st.get('upid')!r} != {upid!r}")
        status = st.get("status")
        check(status in ("running", "stopped"), f"{what}: task status {status!r} not running/stopped")
        if status == "stopped":
            check("exitstatus" in st, f"{what}: stopped task has no exitstatus: {st!r}")
            st["_seen_running"] = seen_running
            return st
        check("exitstatus" not in st, f"{what}: running task has an exitstatus: {st!r}")
        seen_running = True
        check(time.monotonic() < deadline, f"{what}: task {upid} still running after {TASK_TIMEOUT}s")
        time.sleep(0.2)


def wait_ok(api, node, upid, what):
    st = wait_task(api, node, upid, what)
    check(st["exitstatus"] == "OK", f"{what}: task ended {st['exitstatus']!r}, expected 'OK'")
    return st


def make_iso(directory, name):
    """A small file that looks like an ISO 9660 image (primary volume descriptor at 32 KiB)."""
    data = bytearray(64 * 1024)
    pvd = 16 * 2048
    data[pvd:pvd + 7] = b"\x01CD001\x01"
    data[pvd + 40:pvd + 72] = b"PROXMOXER_CONFORMANCE".ljust(32)
    data[pvd + 2048:pvd + 2048 + 7] = b"\xffCD001\x01"  # volume descriptor set terminator
    path = os.path.join(directory, name)
    with open(path, "wb") as f:
        f.write(data)
    return path, bytes(data)


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    requests_seen = []

    def log_message(self, format, *args):  # noqa: A002 - signature from the base class
        QuietHandler.requests_seen.append(self.path)


def main():
    host = os.environ.get("PVESIM_HOST")
    if not host:
        print("PVESIM_HOST is not set (host:port of the simulator)", file=sys.stderr)
        return 2
    node = os.environ.get("PVESIM_NODE", "pve1")
    user = os.environ.get("PVESIM_USER", "root@pam")
    token_name = os.environ.get("PVESIM_TOKEN_ID", "proxops")
    token_value = os.environ.get("PVESIM_TOKEN", "proxops-dev-secret")
    password = os.environ.get("PVESIM_PASSWORD", "proxops")
    print(f"proxmoxer {proxmoxer.__version__} against https://{host} (token {user}!{token_name})")

    api = ProxmoxAPI(
        host,
        user=user,
        token_name=token_name,
        token_value=token_value,
        verify_ssl=False,
        timeout=30,
    )
    # Loopback only: never let a proxy from the environment see this traffic.
    api._store["session"].trust_env = False  # noqa: SLF001 - requests session of proxmoxer

    r = Runner()
    state = {}

    def version():
        v = api.version.get()
        check(isinstance(v, dict), f"/version: expected an object, got {v!r}")
        for key in ("version", "release", "repoid"):
            check(key in v, f"/version: missing '{key}' in {v!r}")
        check(str(v["version"]).startswith("9."), f"/version: expected PVE 9.x, got {v['version']!r}")

    def bad_token():
        bad = ProxmoxAPI(host, user=user, token_name=token_name, token_value="wrong-secret",
                         verify_ssl=False, timeout=30)
        bad._store["session"].trust_env = False  # noqa: SLF001
        try:
            bad.version.get()
        except ResourceException as e:
            check(e.status_code == 401, f"bad token: expected 401, got {e.status_code} ({e})")
            return
        raise StepFailed("bad token: request succeeded, expected 401")

    def nextid():
        vmid = api.cluster.nextid.get()
        check(re.fullmatch(r"[1-9][0-9]{2,8}", str(vmid)) is not None,
              f"/cluster/nextid: not a vmid: {vmid!r}")
        state["vmid"] = int(vmid)

    def create():
        vmid = state["vmid"]
        upid = api.nodes(node).qemu.post(
            vmid=vmid,
            name="proxmoxer-conformance",
            memory=512,
            cores=1,
            ostype="l26",
            scsihw="virtio-scsi-single",
            scsi0="local-lvm:4",
            net0="virtio,bridge=vmbr0",
        )
        check(isinstance(upid, str), f"qemu create: expected a UPID string, got {upid!r}")
        decoded = Tasks.decode_upid(upid)  # proxmoxer's own UPID parser
        check(decoded["node"] == node, f"create UPID node {decoded['node']!r} != {node!r}")
        check(decoded["type"] == "qmcreate", f"create UPID type {decoded['type']!r} != 'qmcreate'")
        check(decoded["id"] == str(vmid), f"create UPID id {decoded['id']!r} != {vmid}")
        check(decoded["user"].startswith(user), f"create UPID user {decoded['user']!r}")
        state["create_upid"] = upid
        # BEHAVIOUR.md 6: the config exists with `lock: create` at once, while the task runs.
        cfg = api.nodes(node).qemu(vmid).config.get()
        if cfg.get("lock") != "create":
            # Only a failure if the task is still running (a very short task may be done).
            st = api.nodes(node).tasks(upid).status.get()
            check(st.get("status") == "stopped",
                  f"config during create: expected lock 'create', got {cfg!r}")

    def create_task():
        st = wait_ok(api, node, state["create_upid"], "qmcreate")
        check(st.get("type") == "qmcreate", f"task status type {st.get('type')!r}")
        check(str(st.get("id")) == str(state["vmid"]), f"task status id {st.get('id')!r}")
        check(st.get("node") == node, f"task status node {st.get('node')!r}")
        # Token callers: user and tokenid are split (BEHAVIOUR.md 5).
        check(st.get("user") == user, f"task status user {st.get('user')!r} != {user!r}")
        check(st.get("tokenid") == token_name, f"task status tokenid {st.get('tokenid')!r}")

    def read_config():
        cfg = api.nodes(node).qemu(state["vmid"]).config.get()
        check(isinstance(cfg, dict), f"config: expected an object, got {cfg!r}")
        check("lock" not in cfg, f"config after create still locked: {cfg.get('lock')!r}")
        net0 = cfg.get("net0", "")
        m = NET0_RE.match(net0)
        check(m is not None, f"net0 {net0!r}: expected 'virtio=<MAC>,bridge=vmbr0' with a generated MAC")
        mac = m.group(1)
        check(int(mac.split(":")[0], 16) & 1 == 0, f"generated MAC {mac} is multicast")
        check(mac != "00:00:00:00:00:00", "generated MAC is all zeroes")
        digest = cfg.get("digest", "")
        check(re.fullmatch(r"[0-9a-f]{40}", digest) is not None,
              f"config digest {digest!r}: expected 40 hex chars (sha1)")
        scsi0 = cfg.get("scsi0", "")
        check(scsi0.startswith(f"local-lvm:vm-{state['vmid']}-disk-"),
              f"scsi0 {scsi0!r}: expected an allocated local-lvm:vm-{state['vmid']}-disk-N volume")
        check("size=4G" in scsi0.split(","), f"scsi0 {scsi0!r}: expected size=4G")
        check(str(cfg.get("memory")) == "512", f"memory {cfg.get('memory')!r} != 512")
        check(cfg.get("name") == "proxmoxer-conformance", f"name {cfg.get('name')!r}")
        state["digest"] = digest
        state["mac"] = mac

    def update_put():
        vmid = state["vmid"]
        res = api.nodes(node).qemu(vmid).config.put(memory=1024, digest=state["digest"])
        check(res is None, f"PUT config: expected data null, got {res!r}")
        cfg = api.nodes(node).qemu(vmid).config.get()
        check(str(cfg.get("memory")) == "1024", f"after PUT memory=1024: memory is {cfg.get('memory')!r}")
        check(cfg.get("digest") != state["digest"], "digest did not change after a config write")
        check(state["mac"] in cfg.get("net0", ""), f"net0 MAC changed by an unrelated update: {cfg.get('net0')!r}")
        state["old_digest"] = state["digest"]
        state["digest"] = cfg["digest"]

    def stale_digest():
        try:
            api.nodes(node).qemu(state["vmid"]).config.put(memory=2048, digest=state["old_digest"])
        except ResourceException as e:
            check(e.status_code == 500, f"stale digest: expected 500, got {e.status_code} ({e})")
            check("checksum mismatch" in str(e), f"stale digest: expected 'checksum mismatch', got {e}")
            cfg = api.nodes(node).qemu(state["vmid"]).config.get()
            check(str(cfg.get("memory")) == "1024", f"rejected write changed memory to {cfg.get('memory')!r}")
            return
        raise StepFailed("PUT config with a stale digest succeeded, expected 500 checksum mismatch")

    def update_post():
        vmid = state["vmid"]
        upid = api.nodes(node).qemu(vmid).config.post(cores=2, digest=state["digest"])
        check(isinstance(upid, str), f"POST config: expected a UPID, got {upid!r}")
        check(Tasks.decode_upid(upid)["type"] == "qmconfig", f"POST config UPID type: {upid}")
        wait_ok(api, node, upid, "qmconfig")
        cfg = api.nodes(node).qemu(vmid).config.get()
        check(str(cfg.get("cores")) == "2", f"after POST cores=2: cores is {cfg.get('cores')!r}")
        state["digest"] = cfg["digest"]

    def start():
        vmid = state["vmid"]
        upid = api.nodes(node).qemu(vmid).status.start.post()
        decoded = Tasks.decode_upid(upid)
        check(decoded["type"] == "qmstart", f"start UPID type {decoded['type']!r} != 'qmstart'")
        st = wait_task(api, node, upid, "qmstart")
        check(st["status"] == "stopped" and st["exitstatus"] == "OK",
              f"start task: status {st['status']!r} exitstatus {st['exitstatus']!r}, expected stopped/OK")
        cur = api.nodes(node).qemu(vmid).status.current.get()
        check(cur.get("status") == "running", f"status/current after start: {cur.get('status')!r}")
        state["start_upid"] = upid

    def start_again():
        # BEHAVIOUR.md 6: qemu returns a UPID, the task fails 'VM <id> already running'.
        vmid = state["vmid"]
        upid = api.nodes(node).qemu(vmid).status.start.post()
        st = wait_task(api, node, upid, "second qmstart")
        check(st["exitstatus"] != "OK" and "already running" in st["exitstatus"],
              f"start of a running VM: exitstatus {st['exitstatus']!r}, expected 'VM {vmid} already running'")

    def list_tasks():
        tasks = api.nodes(node).tasks.get()
        check(isinstance(tasks, list), f"tasks: expected a list, got {tasks!r}")
        by_upid = {t.get("upid"): t for t in tasks}
        for key in ("create_upid", "start_upid"):
            t = by_upid.get(state[key])
            check(t is not None, f"node task list lacks {state[key]}")
            check(t.get("status") == "OK", f"task {state[key]} listed with status {t.get('status')!r}")
            check("endtime" in t, f"finished task {state[key]} lacks endtime: {t!r}")
        vm_tasks = api.nodes(node).tasks.get(vmid=state["vmid"])
        types = {t.get("type") for t in vm_tasks}
        check({"qmcreate", "qmstart"} <= types, f"tasks?vmid={state['vmid']}: types {sorted(types)}")
        cluster_tasks = api.cluster.tasks.get()
        check(state["create_upid"] in {t.get("upid") for t in cluster_tasks},
              "/cluster/tasks lacks the create task")
        log = api.nodes(node).tasks(state["create_upid"]).log.get()
        check(isinstance(log, list) and log, f"task log empty: {log!r}")
        check(log[-1].get("t") == "TASK OK", f"last task log line {log[-1]!r}, expected 'TASK OK'")

    def download_iso():
        tmp = tempfile.mkdtemp(prefix="proxmoxer-conformance-")
        name = f"conformance-{state['vmid']}.iso"
        _, data = make_iso(tmp, name)
        handler = lambda *a, **kw: QuietHandler(*a, directory=tmp, **kw)  # noqa: E731
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            url = f"http://127.0.0.1:{server.server_address[1]}/{name}"
            upid = api.nodes(node).storage("local")("download-url").post(
                url=url,
                filename=name,
                content="iso",
                checksum=hashlib.sha256(data).hexdigest(),
                **{"checksum-algorithm": "sha256"},
            )
            decoded = Tasks.decode_upid(upid)
            check(decoded["type"] == "download", f"download UPID type {decoded['type']!r}")
            wait_ok(api, node, upid, "download")
            check(any(p.startswith(f"/{name}") for p in QuietHandler.requests_seen),
                  f"the simulator never fetched {url} (server saw {QuietHandler.requests_seen})")
        finally:
            server.shutdown()
            server.server_close()
        content = api.nodes(node).storage("local").content.get(content="iso")
        volid = f"local:iso/{name}"
        entry = next((c for c in content if c.get("volid") == volid), None)
        check(entry is not None, f"{volid} not in content listing: {[c.get('volid') for c in content]}")
        check(entry.get("content") == "iso", f"{volid} content {entry.get('content')!r}")
        check(entry.get("format") == "iso", f"{volid} format {entry.get('format')!r}")
        check(int(entry.get("size", -1)) == len(data), f"{volid} size {entry.get('size')!r} != {len(data)}")
        check(str(entry.get("ctime", "")).isdigit(), f"{volid} ctime {entry.get('ctime')!r}")
        state["iso"] = volid

    def ticket_auth():
        # proxmoxer's password auth: POST /access/ticket, then cookie + CSRFPreventionToken.
        t = ProxmoxAPI(host, user=user, password=password, verify_ssl=False, timeout=30)
        t._store["session"].trust_env = False  # noqa: SLF001
        tokens = t.get_tokens()
        check(tokens[0] and tokens[1], f"ticket login: no ticket/CSRF token: {tokens!r}")
        vmid = state["vmid"]
        res = t.nodes(node).qemu(vmid).config.put(description="written with a ticket")
        check(res is None, f"PUT config with a ticket: expected null, got {res!r}")
        got = t.nodes(node).qemu(vmid).config.get().get("description", "")
        check(got.strip() == "written with a ticket", f"description read back {got!r}")
        try:
            ProxmoxAPI(host, user=user, password="wrong-password", verify_ssl=False, timeout=30)
        except AuthenticationError as e:
            check("401" in str(e), f"bad password: expected a 401, got {e}")
            return
        raise StepFailed("login with a wrong password succeeded")

    def token_on_ticket():
        # BEHAVIOUR.md 2: POST /access/ticket lacks allowtoken, so pveproxy refuses a token
        # caller with 403 although the endpoint needs no login.
        try:
            api.access.ticket.post(username=user, password=password)
        except ResourceException as e:
            check(e.status_code == 403,
                  f"token on /access/ticket: expected 403, got {e.status_code} ({e})")
            check("not available with API token, need proper ticket" in str(e),
                  f"token on /access/ticket: message {e}")
            return
        raise StepFailed("token on /access/ticket: the login succeeded, expected 403")

    def permissions():
        perms = api.access.permissions.get()
        check(isinstance(perms, dict), f"/access/permissions: expected an object, got {perms!r}")
        for path, privs in perms.items():
            check(isinstance(privs, dict) and all(str(v) in ("0", "1") for v in privs.values()),
                  f"/access/permissions {path!r}: expected {{privilege: 0|1}}, got {privs!r}")

    def stop_and_delete():
        vmid = state["vmid"]
        wait_ok(api, node, api.nodes(node).qemu(vmid).status.stop.post(), "qmstop")
        cur = api.nodes(node).qemu(vmid).status.current.get()
        check(cur.get("status") == "stopped", f"status/current after stop: {cur.get('status')!r}")
        wait_ok(api, node, api.nodes(node).qemu(vmid).delete(), "qmdestroy")
        try:
            api.nodes(node).qemu(vmid).config.get()
        except ResourceException as e:
            # BEHAVIOUR.md 3: a missing guest is a 500, never a 404.
            check(e.status_code == 500, f"config of a deleted VM: expected 500, got {e.status_code}")
            check("does not exist" in str(e), f"config of a deleted VM: message {e}")
            return
        raise StepFailed(f"VM {vmid} config still readable after delete")

    def delete_iso():
        upid = api.nodes(node).storage("local").content(state["iso"]).delete()
        wait_ok(api, node, upid, "imgdel")
        content = api.nodes(node).storage("local").content.get(content="iso")
        check(state["iso"] not in {c.get("volid") for c in content}, f"{state['iso']} still listed")

    r.step("version", "version", version)
    r.step("badtoken", "bad token is 401", bad_token)
    r.step("nextid", "cluster nextid", nextid)
    r.step("create", "create VM (scsi0=local-lvm:4, net0=virtio,bridge=vmbr0)", create, ["nextid"])
    r.step("created", "wait for qmcreate task", create_task, ["create"])
    r.step("config", "read config (generated MAC, digest)", read_config, ["created"])
    r.step("put", "update config with digest (PUT memory)", update_put, ["config"])
    r.step("stale", "stale digest is refused", stale_digest, ["put"])
    r.step("post", "update config async (POST cores)", update_post, ["put"])
    r.step("start", "start VM, poll task to stopped/OK", start, ["created"])
    r.step("start2", "start of a running VM fails in the task", start_again, ["start"])
    r.step("tasks", "list tasks", list_tasks, ["start"])
    r.step("ticket", "password (ticket) auth: login, CSRF-protected write", ticket_auth, ["put"])
    r.step("tokenticket", "API token on /access/ticket is 403", token_on_ticket)
    r.step("perms", "access permissions of the token", permissions)
    r.step("iso", "download ISO via download-url, find it in content", download_iso, ["nextid"])
    r.step("delete", "stop and delete VM", stop_and_delete, ["start"])
    r.step("isodel", "delete downloaded ISO", delete_iso, ["iso"])

    summary = f"{r.passed} passed, {r.failed} failed"
    if r.skipped:
        summary += f", {r.skipped} skipped"
    print(summary)
    return 1 if r.failed else 0


if __name__ == "__main__":
    sys.exit(main())
