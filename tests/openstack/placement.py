"""A real Placement service fed by Nova's own code with gpuhook's provider configs.

Starts openstack-placement's WSGI application (placement.wsgi.api) on loopback in a child
process (sqlite, auth_strategy = noauth2). For each host, as nova-compute's resource
tracker does at every periodic update: ensure the compute node's provider, give it the
virt driver's inventory and the COMPUTE_NODE trait, merge the provider configs found in
the host's directory (ResourceTracker._merge_provider_configs, configs loaded by
ResourceTracker.__init__ from [compute]provider_config_location), and flush the tree to
Placement (SchedulerReportClient.update_from_provider_tree). Then runs the plan's steps:

  {"op": "candidates", "resources": "CUSTOM_GPU_FERMI:2"}
      -> the hosts GET /allocation_candidates offers, sorted
  {"op": "claim", "host": "cn-a", "resources": "CUSTOM_GPU_FERMI:2"}
      -> the scheduler's claim: that host's allocation request, through
         SchedulerReportClient.claim_resources; true when Placement took it

usage: placement.py WORKDIR PLAN_JSON HOST=PROVIDER_CONFIG_DIR ...
Prints {"steps": [...], "providers": {host: {"inventories": …, "traits": […]}}}.
"""
import json
import os
import socket
import subprocess
import sys
import uuid

from keystoneauth1 import adapter, session, token_endpoint

from nova import conf as nova_conf
from nova import context as nova_context
from nova.compute import resource_tracker
from nova.scheduler.client import report

# The version Nova's scheduler asks for candidates with and claims with.
MICROVERSION = report.SAME_SUBTREE_VERSION

SERVER = r"""
import sys, wsgiref.simple_server as ws
from placement.wsgi.api import application
class Quiet(ws.WSGIRequestHandler):
    def log_message(self, *a):
        pass
srv = ws.make_server("127.0.0.1", int(sys.argv[1]), application, handler_class=Quiet)
print("serving", flush=True)
srv.serve_forever()
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_placement(work):
    with open(os.path.join(work, "placement.conf"), "w") as f:
        f.write(
            "[api]\nauth_strategy = noauth2\n"
            "[placement_database]\n"
            f"connection = sqlite:///{work}/placement.sqlite\n"
            "sync_on_startup = True\n"
        )
    port = free_port()
    env = dict(os.environ, OS_PLACEMENT_CONFIG_DIR=work)
    log = open(os.path.join(work, "placement-api.log"), "w")
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVER, str(port)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    # Its log (oslo.log writes to stdout) ends with our line once it listens.
    for line in proc.stdout:
        log.write(line)
        if line.startswith("serving"):
            break
    else:
        proc.kill()
        sys.exit("placement-api did not start: see " + log.name)
    log.flush()
    return proc, f"http://127.0.0.1:{port}"


def main():
    work, plan = sys.argv[1], json.loads(sys.argv[2])
    hosts = dict(a.split("=", 1) for a in sys.argv[3:])
    nova_conf.CONF([], project="nova", default_config_files=[])
    proc, url = start_placement(work)
    try:
        # noauth2: the token names the user; "admin" has the admin role.
        sess = session.Session(auth=token_endpoint.Token(url, "admin"))

        def new_client():
            return report.SchedulerReportClient(
                adapter=adapter.Adapter(
                    sess, service_type="placement", raise_exc=False))

        ctx = nova_context.get_admin_context()
        uuids = {}
        for host, cfg_dir in hosts.items():
            # Each host's nova-compute has its own client and provider tree.
            client = new_client()
            nova_conf.CONF.set_override(
                "provider_config_location", cfg_dir, group="compute")
            rt = resource_tracker.ResourceTracker(host, None, reportclient=client)
            cn = str(uuid.uuid5(uuid.NAMESPACE_DNS, host))
            uuids[host] = cn
            tree = client.get_provider_tree_and_ensure_root(ctx, cn, name=host)
            tree.update_inventory(cn, {
                "VCPU": {"total": 64, "reserved": 0, "min_unit": 1, "max_unit": 64,
                         "step_size": 1, "allocation_ratio": 4.0},
                "MEMORY_MB": {"total": 515072, "reserved": 512, "min_unit": 1,
                              "max_unit": 515072, "step_size": 1,
                              "allocation_ratio": 1.0},
            })
            tree.update_traits(cn, ["COMPUTE_NODE"])
            rt._merge_provider_configs(rt.provider_configs, tree)
            client.update_from_provider_tree(ctx, tree)
        names = {v: k for k, v in uuids.items()}
        client = new_client()  # the scheduler's
        steps = []
        for step in plan:
            r = client.get(
                "/allocation_candidates?resources=" + step["resources"],
                version=MICROVERSION)
            if r.status_code != 200:
                sys.exit(f"GET /allocation_candidates: {r.status_code} {r.text}")
            body = r.json()
            offered = {}
            for req in body["allocation_requests"]:
                (rp,) = req["allocations"].keys()
                offered[names[rp]] = req
            if step["op"] == "candidates":
                steps.append(sorted(offered))
            elif step["op"] == "claim":
                req = offered.get(step["host"])
                ok = req is not None and client.claim_resources(
                    ctx, str(uuid.uuid4()), req, "feed0000feed0000feed0000feed0000",
                    "c0ffee00c0ffee00c0ffee00c0ffee00",
                    allocation_request_version=MICROVERSION)
                steps.append(bool(ok))
            else:
                sys.exit(f"unknown step {step}")
        providers = {}
        for host, cn in uuids.items():
            inv = client.get(f"/resource_providers/{cn}/inventories",
                             version=MICROVERSION).json()["inventories"]
            traits = client.get(f"/resource_providers/{cn}/traits",
                                version=MICROVERSION).json()["traits"]
            providers[host] = {"inventories": inv, "traits": sorted(traits)}
        print(json.dumps({"steps": steps, "providers": providers}))
    finally:
        proc.kill()
        proc.wait()


if __name__ == "__main__":
    main()
