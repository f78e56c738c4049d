"""The PVE stand-in answers the calls the real Proxmox provider makes as PVE 9 does, where fakepve alone
does not (tests/stand_ins/proxmox_ve.py's docstring lists each). Each case sends what bpg's provider sends."""

import http.server
import threading
import time

import pytest
import requests

from tests.stand_ins.proxmox_ve import PVE_HOST, TOKEN_ID, TOKEN_SECRET, serve_proxmox

VM_ID = 9101
CONFIG = {"cores": 2, "sockets": 1, "memory": "4096", "cpu": "host", "scsihw": "virtio-scsi-pci",
          "net0": "virtio=BC:24:11:00:01:01,bridge=vmbr0", "agent": "enabled=1,fstrim_cloned_disks=1,type=virtio",
          "scsi0": "local-lvm:vm-9101-disk-0,size=20G,ssd=1,discard=on,iothread=1,format=raw"}


@pytest.fixture
def pve():
    with serve_proxmox() as pve:
        pve.add_vm(VM_ID, "cp-1", node=PVE_HOST, status="running", config=dict(CONFIG))
        yield pve


def call(pve, method, path, /, **form):
    """One request as the provider's Go client sends it: form-encoded body, token header."""
    reply = requests.request(method, f"{pve.url}/api2/json/{path}", verify=pve.cafile,
                             headers={"Authorization": f"PVEAPIToken={TOKEN_ID}={TOKEN_SECRET}"},
                             **({"params": form} if method in ("GET", "DELETE") else {"data": form}))
    return reply


def data(reply):
    assert reply.status_code == 200, reply.text
    return reply.json()["data"]


def vm_path(rest=""):
    return f"nodes/{PVE_HOST}/qemu/{VM_ID}{rest}"


def test_a_delete_with_a_trailing_slash_destroys_the_vm(pve):
    call(pve, "POST", vm_path("/status/stop"))
    upid = data(call(pve, "DELETE", vm_path("/"), **{"destroy-unreferenced-disks": 1, "purge": 1}))
    assert ":qmdestroy:" in upid
    gone = call(pve, "GET", vm_path("/status/current"))
    assert gone.status_code == 500 and "does not exist" in gone.text
    assert [e.what for e in pve.vm_events if e.vm_id == VM_ID] == ["destroyed"]


def test_config_shows_pending_values_applied_and_current_1_the_running_ones(pve):
    data(call(pve, "PUT", vm_path("/config"), cores="4", memory="8192", name="cp-1"))
    pending = data(call(pve, "GET", vm_path("/config")))
    running = data(call(pve, "GET", vm_path("/config"), current=1))
    assert (pending["cores"], pending["memory"]) == (4, "8192")  # typed, as PVE stores them
    assert (running["cores"], running["memory"]) == (2, "4096")


def test_a_running_vm_takes_nics_and_new_disks_at_once_and_keeps_cpu_memory_and_disk_options_pending(pve):
    data(call(pve, "PUT", vm_path("/config"), net0="virtio=BC:24:11:00:01:01,bridge=vmbr1", cores="4",
              cpu="x86-64-v3", scsi1="local-lvm:10,format=raw,ssd=1", scsihw="virtio-scsi-single",
              scsi0="local-lvm:vm-9101-disk-0,ssd=1,discard=on,iothread=0,format=raw",
              agent="enabled=1,fstrim_cloned_disks=1,type=isa", delete="vcpus,cpulimit"))
    running = data(call(pve, "GET", vm_path("/config"), current=1))
    assert running["net0"].endswith("bridge=vmbr1")
    assert running["scsi1"].startswith("local-lvm:vm-9101-disk-") and "size=10G" in running["scsi1"]
    pending = {item["key"]: item for item in data(call(pve, "GET", vm_path("/pending")))}
    assert {key for key, item in pending.items() if "pending" in item or "delete" in item} == {
        "cores", "cpu", "scsihw", "scsi0", "agent"}  # no delete of the unset vcpus and cpulimit
    assert pending["cores"]["pending"] == 4 and running["cores"] == 2


def test_a_stopped_vm_takes_everything_at_once_and_a_value_equal_to_the_running_one_is_not_pending(pve):
    data(call(pve, "PUT", vm_path("/config"), cores="2", cpu="host"))
    assert not [item for item in data(call(pve, "GET", vm_path("/pending"))) if "pending" in item]
    call(pve, "POST", vm_path("/status/stop"))
    data(call(pve, "PUT", vm_path("/config"), cores="6"))
    assert data(call(pve, "GET", vm_path("/config"), current=1))["cores"] == 6


def test_resize_grows_the_running_config_and_refuses_to_shrink(pve):
    data(call(pve, "PUT", vm_path("/resize"), disk="scsi0", size="30G"))
    assert "size=30G" in data(call(pve, "GET", vm_path("/config"), current=1))["scsi0"]
    shrink = call(pve, "PUT", vm_path("/resize"), disk="scsi0", size="10G")
    assert shrink.status_code == 500 and "shrinking disks is not supported" in shrink.text


@pytest.fixture
def iso_server():
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self):  # noqa: N802
            self.send_response(200 if self.path.endswith(".iso") else 404)
            self.send_header("Content-Type", "application/x-iso9660-image")
            self.send_header("Content-Length", "4096")
            self.end_headers()

        def log_message(self, *args):
            pass
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def test_query_url_metadata_reads_the_url_and_a_missing_one_is_an_error(pve, iso_server):
    found = data(call(pve, "GET", f"nodes/{PVE_HOST}/query-url-metadata", url=f"{iso_server}/talos.iso"))
    assert found == {"filename": "talos.iso", "mimetype": "application/x-iso9660-image", "size": 4096}
    missing = call(pve, "GET", f"nodes/{PVE_HOST}/query-url-metadata", url=f"{iso_server}/nothing")
    assert missing.status_code == 500 and "404" in missing.text


def test_a_second_download_of_a_file_fails_its_task_refusing_to_override_it(pve, iso_server):
    form = dict(content="iso", filename="talos.iso", url=f"{iso_server}/talos.iso")
    first = data(call(pve, "POST", f"nodes/{PVE_HOST}/storage/local/download-url", **form))
    second = data(call(pve, "POST", f"nodes/{PVE_HOST}/storage/local/download-url", **form))
    status = lambda upid: data(call(pve, "GET", f"nodes/{PVE_HOST}/tasks/{upid}/status"))["exitstatus"]  # noqa: E731
    assert status(first) == "OK"
    assert status(second) == "refusing to override existing file '/var/lib/vz/template/iso/talos.iso'"


def test_a_drive_sent_with_a_file_key_is_stored_as_pve_prints_it(pve):
    data(call(pve, "PUT", vm_path("/config"), ide2="file=local:iso/talos.iso,media=cdrom,", name="cp-1"))
    assert data(call(pve, "GET", vm_path("/config")))["ide2"] == "local:iso/talos.iso,media=cdrom"


def test_a_held_call_is_done_after_its_client_gave_up_and_other_calls_answer_meanwhile(pve):
    call(pve, "POST", vm_path("/status/stop"))
    pve.hold("POST", vm_path("/status/start"), seconds=1.0)
    with pytest.raises(requests.exceptions.ReadTimeout):
        requests.post(f"{pve.url}/api2/json/{vm_path('/status/start')}", verify=pve.cafile, timeout=0.3,
                      headers={"Authorization": f"PVEAPIToken={TOKEN_ID}={TOKEN_SECRET}"})
    assert data(call(pve, "GET", vm_path("/status/current")))["status"] == "stopped"  # other calls answer
    deadline = time.monotonic() + 5
    while data(call(pve, "GET", vm_path("/status/current")))["status"] != "running":
        assert time.monotonic() < deadline, "the held start was never done"
        time.sleep(0.05)
    assert pve.holds == {}  # used up: the next start is answered at once
