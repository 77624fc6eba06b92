"""Prints the domain XML Nova's libvirt driver writes for an LXC instance of a flavor.

The <metadata> comes from Nova's own LibvirtDriver._get_guest_config_meta (the
LibvirtConfigGuestMetaNova* classes), the domain around it from LibvirtConfigGuest, as
nova-compute builds them with [libvirt]virt_type = lxc.

usage: nova_domain.py NAME UUID INIT FLAVOR_NAME EXTRA_SPECS_JSON
"""
import json
import sys

from nova.network import model as network_model
from nova.virt import driver
from nova.virt.libvirt import config as vconfig
from nova.virt.libvirt.driver import LibvirtDriver
from nova import conf as nova_conf

nova_conf.CONF([], project="nova", default_config_files=[])

name, uuid, init, flavor, specs = sys.argv[1:6]
port = network_model.VIF(
    id="3c1e9a0e-5a47-4b8e-9d1b-0f1e2d3c4b5a",
    network=network_model.Network(subnets=[network_model.Subnet(ips=[
        network_model.FixedIP(address="10.0.0.17", version=4)])]))
dmeta = driver.InstanceDriverMetadata(
    root_type="image",
    root_id="7a0b4f5e-2c1d-4e3f-8a9b-0c1d2e3f4a5b",
    instance_meta=driver.NovaInstanceMeta(name=name, uuid=uuid),
    owner=driver.OwnerMeta(
        userid="c0ffee00c0ffee00c0ffee00c0ffee00", username="demo",
        projectid="feed0000feed0000feed0000feed0000", projectname="gpu-lab"),
    image=driver.ImageMeta(
        id="7a0b4f5e-2c1d-4e3f-8a9b-0c1d2e3f4a5b", name="busybox-rootfs",
        container_format="bare", disk_format="raw", min_disk=0, min_ram=0,
        properties={"hw_architecture": "x86_64", "img_config_drive": "optional"}),
    flavor=driver.FlavorMeta(
        name=flavor, flavorid="7", memory_mb=64, vcpus=1, root_gb=1,
        ephemeral_gb=0, extra_specs=json.loads(specs), swap=0),
    network_info=network_model.NetworkInfo([port]),
)
guest = vconfig.LibvirtConfigGuest()
guest.virt_type = "lxc"
guest.name = name
guest.uuid = uuid
guest.memory = 65536
guest.vcpus = 1
guest.os_type = "exe"
guest.os_init_path = init
guest.metadata.append(LibvirtDriver._get_guest_config_meta(None, dmeta))
console = vconfig.LibvirtConfigGuestConsole()
console.type = "pty"
guest.add_device(console)
sys.stdout.write(guest.to_xml())
