//! `gpuhook` command line (clap): `list`, `check`, `attach`, `detach`, `release`, `hook`, ….
//!
//! The clap definitions of both binaries live here so that man pages and completions can
//! be generated from them without linking libvirt: `cargo run -p xtask -- dist DIR`
//! (`packaging/build.sh` runs it) writes `gpuhook(1)`, `gpuhook-libvirt(1)`,
//! `gpuhook-runtime(1)` ([`runtime_command`]) and the shell completions into `DIR`.

use crate::doors::error::CliError;
use crate::doors::hook;
use crate::log;
use crate::reserve::lifecycle::Pick;
use clap::{CommandFactory, Parser, Subcommand};
use std::path::PathBuf;

mod check;
mod common;
mod driver;
mod health;
use check::check;
use common::{emit, load};
use health::health;
pub use health::HealthAction;
mod list;
mod release;
mod show;
use list::list;
pub use list::list_json;

pub const ABOUT: &str =
    "Hand whole GPUs to libvirt LXC domains and OCI containers from one pool, and take them back";

#[derive(Debug, Parser)]
#[command(name = "gpuhook", version, about = ABOUT, long_about = "\
gpuhook hands whole host GPUs (or MIG instances, or slots of GPUs the host shares) to \
containers, exclusively, and takes them back when they stop. Every door draws on one pool \
(one state file under one lock): a GPU one holder has is never given to another, whichever \
door each came through. One static binary, no daemon. Its doors:\n\n\
libvirt LXC hook: installed as /etc/libvirt/hooks/lxc (or /etc/libvirt/hooks/lxc.d/50-gpuhook \
beside another hook), libvirt runs it at every LXC lifecycle step. A domain asks for GPUs in \
its <metadata> (namespace urn:gpuhook:gpu:1): they are reserved at prepare, granted in its \
device cgroup and made in its /dev at started, freed at stop.\n\n\
OCI runtime wrapper: gpuhook-runtime (a link to gpuhook; also 'gpuhook runtime -- ARGS'), \
which podman, docker, containerd and CRI-O call as they call runc. A bundle whose \
config.json asks (gpuhook.io/ annotations, GPUHOOK_ variables) gets its GPUs reserved and \
written into its config.json, and freed when the container is removed: gpuhook-runtime(1).\n\n\
Command line: the commands below, for operators (attach and detach hand GPUs to running \
domains and containers). gpuhook-libvirt(1), linked with libvirt, reconciles reservations \
with libvirt and sets domains' requests.\n\n\
Config: /etc/gpuhook/config.json, or the file named by $GPUHOOK_CONFIG or --config. \
Guides: the README and docs/guides/ (installed in /usr/share/doc/gpuhook/).")]
pub struct Cli {
    /// Config file (default: $GPUHOOK_CONFIG, else /etc/gpuhook/config.json)
    #[arg(short, long, global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Also print informational messages on stderr
    #[arg(short, long, global = true)]
    pub verbose: bool,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// List the host's GPUs and who holds them
    List {
        /// Print the stable JSON form
        #[arg(long)]
        json: bool,
    },
    /// Validate a domain XML's (or an OCI bundle's config.json's) GPU request and show what
    /// it would get now (dry run)
    ///
    /// FILE is a domain XML (virsh dumpxml NAME), or an OCI bundle's config.json (JSON with
    /// "ociVersion": its gpuhook.io/ annotations, else its GPUHOOK_ variables, read as
    /// gpuhook-runtime reads them); - or no FILE reads standard input (not a terminal). Exit
    /// 0 when it asks for nothing or would get what it asks for now, 1 otherwise.
    Check {
        /// Domain XML or bundle config.json file, or - for standard input
        #[arg(value_name = "FILE|-")]
        file: Option<String>,
        /// Print JSON: file, kind (domain or bundle), name, uuid, request, source, warnings,
        /// holds, satisfiable, refusal, gpus, nodes, driver
        #[arg(long)]
        json: bool,
    },
    /// Give a running container more GPUs (or MIG instances): reserved, granted in its
    /// device cgroup and made in its /dev, all or nothing
    Attach(crate::doors::hotplug::AttachArgs),
    /// Take GPUs back from a running container: revoked, removed from its /dev, freed
    Detach(crate::doors::hotplug::DetachArgs),
    /// Free the GPU reservation of a domain, VM or OCI container that no longer runs
    ///
    /// One holder only: a NAME that more than one holder answers to (an LXC domain, a VM
    /// and an OCI container may share a name) is refused naming each, and --domain,
    /// --container or --vm says which; a NAME no holder answers to exits 1. A holder whose
    /// container still runs is refused (its device access would outlive the reservation):
    /// stop it, or take its GPUs back with 'gpuhook detach NAME --all' first.
    Release {
        /// Domain or VM name or UUID, or container ID
        name: String,
        /// NAME is a libvirt LXC domain (its name or UUID)
        #[arg(long, conflicts_with_all = ["container", "vm"])]
        domain: bool,
        /// NAME is an OCI container's ID
        #[arg(long, conflicts_with = "vm")]
        container: bool,
        /// NAME is a virtual machine (a libvirt QEMU domain: its name or UUID)
        #[arg(long)]
        vm: bool,
        /// Print JSON: holder (kind, name, uuid), released (its units), draining (unit,
        /// pids, unread)
        #[arg(long)]
        json: bool,
    },
    /// One holder's whole story: its GPUs, phase, init, cgroup, driver files, and when and
    /// through which door it reserved them
    ///
    /// NAME as release takes it (a domain's or VM's name or UUID, a container's ID; one
    /// holder only, --domain, --container or --vm say which); a NAME no holder of GPUs
    /// answers to exits 1.
    Show {
        /// Domain or VM name or UUID, or container ID
        name: String,
        /// NAME is a libvirt LXC domain (its name or UUID)
        #[arg(long, conflicts_with_all = ["container", "vm"])]
        domain: bool,
        /// NAME is an OCI container's ID
        #[arg(long, conflicts_with = "vm")]
        container: bool,
        /// NAME is a virtual machine (a libvirt QEMU domain: its name or UUID)
        #[arg(long)]
        vm: bool,
        /// Print JSON: holder, door, hotplugged, phase, stale, request, created, updated,
        /// gpus, nodes, init, controller, prepared_by, cgroup, driver, driver_version,
        /// driver_outdated, mounts
        #[arg(long)]
        json: bool,
    },
    /// Print the shell completion script for gpuhook (bash, zsh, fish, elvish, powershell)
    ///
    /// bash: gpuhook completions bash > /etc/bash_completion.d/gpuhook (the packages install
    /// it); zsh: into a directory of $fpath as _gpuhook; fish: into
    /// ~/.config/fish/completions/gpuhook.fish.
    Completions {
        /// The shell
        shell: clap_complete::Shell,
    },
    /// Run the libvirt hook explicitly (domain XML on standard input)
    ///
    /// libvirt's LXC hook (as /etc/libvirt/hooks/lxc runs it), or with --qemu its QEMU hook
    /// (as /etc/libvirt/hooks/qemu runs it, for virtual machines).
    Hook {
        /// libvirt's QEMU hook (a virtual machine's hostdevs) instead of the LXC one
        #[arg(long)]
        qemu: bool,
        /// Domain name
        domain: String,
        /// prepare, start, started, stopped, release or reconnect (QEMU also: restore,
        /// attach, migrate)
        op: String,
        /// begin or end
        subop: String,
        /// Extra arguments libvirt passes (ignored)
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        extra: Vec<String>,
    },
    /// Write the GPUs and reservations as Prometheus metrics (node_exporter textfile format)
    Metrics {
        /// Replace this file atomically instead of printing (e.g.
        /// /var/lib/prometheus/node-exporter/gpuhook.prom)
        #[arg(long, value_name = "FILE")]
        output: Option<PathBuf>,
    },
    /// Write this host's GPUs as an OpenStack Nova provider config (Placement inventories
    /// CUSTOM_GPU_<ARCH> and traits)
    Placement {
        /// Replace this file atomically instead of printing (e.g.
        /// /etc/nova/provider_config/gpuhook.yaml)
        #[arg(long, value_name = "FILE")]
        output: Option<PathBuf>,
    },
    /// Serve kubelet's device plugin API (v1beta1) over the pool: advertise its GPUs, MIG
    /// instances and shared slots to Kubernetes and reserve them for pods (runs
    /// gpuhook-device-plugin, a long-running process, with these arguments)
    DevicePlugin {
        /// Arguments for gpuhook-device-plugin (see gpuhook-device-plugin --help)
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<std::ffi::OsString>,
    },
    /// GPU health: act on the NVIDIA Xid errors of the kernel log as NVIDIA's Xid catalog
    /// says, reset GPUs, lift quarantines
    Health {
        #[command(subcommand)]
        action: HealthAction,
    },
    /// Show what driver="host" gives now: the loaded NVIDIA kernel module's version and its
    /// user space found on this host (libraries, firmware, programs, sockets, config files)
    Driver {
        /// Print JSON
        #[arg(long)]
        json: bool,
    },
    /// CDI specs: write the running driver's as one, or check the vendors' for staleness
    Cdi {
        #[command(subcommand)]
        action: driver::CdiAction,
    },
    /// The create-symlinks and update-ldcache hooks of a spec `gpuhook cdi generate` wrote
    /// (run by an OCI runtime; the container's state on stdin)
    #[command(name = "cdi-hook", hide = true)]
    CdiHook {
        /// create-symlinks --link TARGET::LINK…, or update-ldcache --folder DIR…
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Run as the OCI runtime wrapper (what gpuhook-runtime does): 'gpuhook runtime -- ARGS'
    Runtime {
        /// The real runtime's arguments (runc's command line)
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<std::ffi::OsString>,
    },
    /// An OCI hook gpuhook-runtime adds to GPU containers (container state on stdin)
    #[command(hide = true)]
    OciHook {
        /// create-runtime, cdi or poststop
        stage: String,
        /// The reservation it belongs to (PID.START of the create that made it)
        token: Option<String>,
        /// What that create added to the config (read back from the config, not used here);
        /// for cdi, the work in the container's root (JSON)
        added: Option<String>,
    },
}

/// `gpuhook-libvirt` command line (the binary lives in its own crate, linked with libvirt).
#[derive(Debug, Parser)]
#[command(
    name = "gpuhook-libvirt",
    version,
    about = "gpuhook's libvirt companion: reconcile GPU reservations with libvirt, set GPU requests on domains"
)]
pub struct LibvirtCli {
    /// libvirt connection URI [default: lxc:///system; `request` of a domain it does not
    /// know then looks on --qemu-connect's]
    #[arg(short = 'c', long, env = "GPUHOOK_LIBVIRT_URI", global = true)]
    pub connect: Option<String>,
    /// libvirt's QEMU driver (virtual machines): what `reconcile` asks which VMs run, where
    /// `request` finds a VM
    #[arg(
        long,
        default_value = "qemu:///system",
        env = "GPUHOOK_LIBVIRT_QEMU_URI",
        global = true,
        value_name = "URI"
    )]
    pub qemu_connect: String,
    /// gpuhook config file (default: $GPUHOOK_CONFIG, else /etc/gpuhook/config.json)
    #[arg(long, global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,
    #[command(subcommand)]
    pub command: LibvirtCommand,
}

#[derive(Debug, Subcommand)]
// Parsed once per run: the size of a variant does not matter.
#[allow(clippy::large_enum_variant)]
pub enum LibvirtCommand {
    /// Free reservations of domains libvirt no longer runs
    Reconcile {
        /// Only report what would be freed
        #[arg(long)]
        dry_run: bool,
    },
    /// Print the shell completion script for gpuhook-libvirt (bash, zsh, fish, elvish,
    /// powershell)
    Completions {
        /// The shell
        shell: clap_complete::Shell,
    },
    /// Set (or with --clear remove) the GPU request of a defined domain
    ///
    /// An LXC domain gets gpuhook's <gpu:gpus> element in its <metadata>. A QEMU domain (a
    /// virtual machine) gets the GPUs chosen now, with the other functions of their PCI
    /// devices, as <hostdev mode='subsystem' type='pci' managed='yes'> elements in its
    /// persistent definition (--clear removes those gpuhook wrote); they are reserved when it
    /// starts.
    Request {
        /// Domain name or UUID
        domain: String,
        #[command(flatten)]
        request: RequestArgs,
        /// Remove the GPU request instead
        #[arg(long, conflicts_with_all = ["count", "arch", "vendor", "model", "device", "capabilities", "mode", "uid", "gid", "mig", "share", "driver", "numa"])]
        clear: bool,
        /// Also change the live definition of a running domain (its GPUs change only at its
        /// next start either way; the live request guides reconnect)
        #[arg(long)]
        live: bool,
    },
}

/// The GPU request `gpuhook-libvirt request` sets (the attributes of `<gpu:gpus>`).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct RequestArgs {
    /// How many GPUs
    #[arg(long, required_unless_present_any = ["clear", "device"])]
    pub count: Option<u32>,
    /// Architecture (fermi, kepler, … hopper, blackwell)
    #[arg(long)]
    pub arch: Option<String>,
    /// Vendor: nvidia, amd, intel
    #[arg(long)]
    pub vendor: Option<String>,
    /// Substring of the model name
    #[arg(long)]
    pub model: Option<String>,
    /// Exact GPU by PCI address or GPU UUID (repeatable)
    #[arg(long, value_name = "PCI|UUID")]
    pub device: Vec<String>,
    /// compute,utility,graphics,video
    #[arg(long)]
    pub capabilities: Option<String>,
    /// Octal mode of the created nodes
    #[arg(long)]
    pub mode: Option<String>,
    /// Container-side owner uid of the nodes
    #[arg(long)]
    pub uid: Option<u32>,
    /// Container-side owner gid of the nodes
    #[arg(long)]
    pub gid: Option<u32>,
    /// MIG compute instances instead of whole GPUs (--count of them)
    #[arg(long)]
    pub mig: bool,
    /// Slots of shared GPUs instead of whole GPUs (the host's "sharing" config)
    #[arg(long, conflicts_with = "mig")]
    pub share: bool,
    /// The host driver's user space: none (nodes only), cdi (from the vendor's CDI spec) or
    /// host (the running driver's files, found on the host)
    #[arg(long, value_parser = ["none", "cdi", "host"])]
    pub driver: Option<String>,
    /// Only GPUs on this NUMA node (a virtual machine's request)
    #[arg(long, value_name = "N")]
    pub numa: Option<u32>,
}

impl RequestArgs {
    /// The request the options make, checked as `gpuhook attach`'s are (each as the XML's
    /// attribute of that name), a refusal in the options' words (`--count`, `--device`).
    pub fn request(&self) -> Result<crate::request::Request, crate::request::oci::OciError> {
        use crate::request::oci::{KeyFrom, Pairs};
        let mut pairs = Pairs::new();
        let mut put = |key: &str, flag: &'static str, v: Option<String>| {
            if let Some(v) = v {
                pairs.insert(key.to_string(), (KeyFrom::Flag(flag), v));
            }
        };
        put("gpus", "--count", self.count.map(|c| c.to_string()));
        put("vendor", "--vendor", self.vendor.clone());
        put("arch", "--arch", self.arch.clone());
        put("model", "--model", self.model.clone());
        put(
            "devices",
            "--device",
            (!self.device.is_empty()).then(|| self.device.join(",")),
        );
        put("capabilities", "--capabilities", self.capabilities.clone());
        put("mode", "--mode", self.mode.clone());
        put("uid", "--uid", self.uid.map(|c| c.to_string()));
        put("gid", "--gid", self.gid.map(|c| c.to_string()));
        put("mig", "--mig", self.mig.then(|| "yes".to_string()));
        put("share", "--share", self.share.then(|| "yes".to_string()));
        put("driver", "--driver", self.driver.clone());
        crate::request::oci::request(&pairs)
    }
}

/// Writes the completion script of `cmd` for `shell` on stdout (a reader that stops early,
/// `| head`, is no error).
pub fn completions(shell: clap_complete::Shell, mut cmd: clap::Command) {
    use std::io::Write;
    let name = cmd.get_name().to_owned();
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut cmd, name, &mut script);
    let _ = std::io::stdout().lock().write_all(&script);
}

pub fn main(args: Vec<std::ffi::OsString>) -> i32 {
    let cli = match Cli::try_parse_from(args) {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() { 2 } else { 0 };
            let _ = e.print();
            return code;
        }
    };
    log::set_verbose(cli.verbose);
    if let Some(c) = &cli.config {
        std::env::set_var(crate::host::config::ENV, c);
    }
    match cli.command {
        Command::Hook {
            qemu: true,
            domain,
            op,
            ..
        } => crate::doors::qemu_hook::main(&domain, &op),
        Command::Hook { domain, op, .. } => match hook::read_stdin() {
            Ok(xml) => hook::run(&domain, &op, &xml),
            Err(e) => {
                log::error(&format!(
                    "domain '{domain}': reading the domain XML from stdin: {e}"
                ));
                1
            }
        },
        Command::List { json } => report(list(json)),
        Command::Check { file, json } => {
            let input = match file.as_deref() {
                None => check::Input::Stdin(false),
                Some("-") => check::Input::Stdin(true),
                Some(f) => check::Input::File(f),
            };
            if check::waits_on_a_terminal(&input) {
                eprintln!("gpuhook: {}", check::ON_A_TERMINAL);
                return 2;
            }
            report(check(input, json))
        }
        Command::Attach(a) => report(crate::doors::hotplug::attach(&a)),
        Command::Detach(d) => report(crate::doors::hotplug::detach(&d)),
        Command::Release {
            name,
            domain,
            container,
            vm,
            json,
        } => report(release::release(
            &name,
            Pick::of(domain, container, vm),
            json,
        )),
        Command::Show {
            name,
            domain,
            container,
            vm,
            json,
        } => report(show::show(&name, Pick::of(domain, container, vm), json)),
        Command::Completions { shell } => {
            completions(shell, Cli::command());
            0
        }
        Command::Metrics { output } => report(metrics(output.as_deref())),
        Command::Placement { output } => report(placement(output.as_deref())),
        Command::Health { action } => report(health(action)),
        Command::DevicePlugin { args } => device_plugin(&args, cli.verbose),
        Command::Driver { json } => report(driver::show(json)),
        Command::Cdi { action } => report(driver::cdi(action)),
        Command::CdiHook { args } => report(driver::cdi_hook(&args)),
        Command::Runtime { args } => crate::doors::runtime::main(&args),
        Command::OciHook {
            stage,
            token,
            added,
        } => crate::doors::runtime::oci_hook(&stage, token.as_deref(), added.as_deref()),
    }
}

/// The device plugin's own program: beside this one (the packages install both in
/// `/usr/bin`), else `/usr/bin`.
pub const DEVICE_PLUGIN: &str = "gpuhook-device-plugin";

/// `gpuhook device-plugin ARGS…`: becomes `gpuhook-device-plugin ARGS…` (gRPC lives in that
/// program alone, so the hook's binary carries none); the config named by `--config` passes
/// in `GPUHOOK_CONFIG`. Returns only when it cannot be run.
fn device_plugin(args: &[std::ffi::OsString], verbose: bool) -> i32 {
    use std::os::unix::ffi::OsStrExt;
    let beside = std::fs::canonicalize("/proc/self/exe")
        .ok()
        .and_then(|p| p.parent().map(|d| d.join(DEVICE_PLUGIN)))
        .filter(|p| p.is_file());
    let program = beside.unwrap_or_else(|| std::path::Path::new("/usr/bin").join(DEVICE_PLUGIN));
    let c = |s: &std::ffi::OsStr| std::ffi::CString::new(s.as_bytes());
    let verbose = verbose.then(|| std::ffi::OsString::from("--verbose"));
    let argv: Result<Vec<std::ffi::CString>, _> = std::iter::once(program.as_os_str())
        .chain(verbose.as_deref())
        .chain(args.iter().map(std::ffi::OsString::as_os_str))
        .map(c)
        .collect();
    let (Ok(path), Ok(argv)) = (c(program.as_os_str()), argv) else {
        log::error("device-plugin: an argument contains a NUL byte");
        return 2;
    };
    let e = nix::unistd::execv(&path, &argv).unwrap_err();
    log::error(&format!(
        "device-plugin: cannot run {}: {e} (is the gpuhook package's {DEVICE_PLUGIN} installed?)",
        program.display()
    ));
    127
}

fn metrics(output: Option<&std::path::Path>) -> Result<i32, CliError> {
    let (cfg, mut inv, st, passed) = common::load_with_vms()?;
    // A draining GPU is not usable, as a quarantined one is not.
    crate::reserve::drain::apply(&mut inv, &st);
    let mut text = crate::openstack::metrics::render_with(&inv, &st, &passed);
    // Containers on an older driver, and stale CDI specs (a spec directory that cannot be
    // read leaves that family empty, said in the log).
    let specs = match driver::checked(&cfg) {
        Ok(c) => c
            .iter()
            .map(|c| (c.spec.display().to_string(), !c.stale.is_empty()))
            .collect(),
        Err(e) => {
            log::warn(&format!("gpuhook_cdi_spec_stale: {e}"));
            Vec::new()
        }
    };
    let host = crate::host::driver::module_version(&cfg.proc).ok();
    text.push_str(&crate::openstack::metrics::render_driver(
        &st,
        host.as_deref(),
        &specs,
    ));
    emit(&text, output)
}

fn placement(output: Option<&std::path::Path>) -> Result<i32, CliError> {
    // The state as every command reads it: one that cannot be read fails the command, and no
    // inventory is published (quarantined, draining and held GPUs would be offered as free).
    let (_, mut inv, st) = load()?;
    // Quarantined and draining GPUs count as reserved, as unusable ones do.
    crate::reserve::drain::apply(&mut inv, &st);
    // GPUs VMs hold (whole, or by their mediated devices): used, as Nova's allocations are.
    for g in inv.gpus.iter_mut() {
        if let Some(r) = st.reservations.values().find(|r| {
            r.kind() == crate::reserve::state::HolderKind::Vm
                && r.gpus.iter().any(|u| u.pci() == g.pci)
        }) {
            g.problem = Some(format!("held by {}", r.who()));
        }
    }
    // Slots held of a GPU the config no longer shares: not free for a whole flavor.
    let held = st.held(None);
    for g in inv.gpus.iter_mut().filter(|g| g.sharing.is_none()) {
        if let Some((_, h)) = crate::reserve::alloc::slots_of(&held, g.pci).next() {
            g.problem.get_or_insert_with(|| {
                format!("held as a shared slot by {h}, not shared by the config now")
            });
        }
    }
    for g in inv.gpus.iter().filter(|g| g.arch.is_none()) {
        log::warn(&format!(
            "GPU {} ({}) has no known architecture: no Placement inventory for it (name one in the config's overrides)",
            g.pci, g.model
        ));
    }
    emit(&crate::openstack::placement::render(&inv), output)
}

fn report(r: Result<i32, impl std::fmt::Display>) -> i32 {
    match r {
        Ok(code) => code,
        Err(e) => {
            log::error(&e.to_string());
            1
        }
    }
}

/// `gpuhook-runtime`'s manual page (the wrapper itself takes runc's command line unparsed).
pub fn runtime_command() -> clap::Command {
    // --help and --version are the real runtime's.
    clap::Command::new("gpuhook-runtime")
        .disable_help_flag(true)
        .disable_version_flag(true)
        .about("OCI runtime wrapper that hands reserved GPUs to podman, docker, containerd and CRI-O containers")
        .long_about("\
gpuhook-runtime (a link to gpuhook) is called by container engines exactly as they call runc; \
it runs the real runtime (config key oci_runtime, else the first crun or runc in /usr/bin, \
/usr/sbin, /usr/local/bin, /usr/local/sbin) with the same arguments, environment and file \
descriptors, and returns its exit status.\n\n\
On create or run of a bundle whose config.json asks for GPUs (annotations gpuhook.io/gpus, \
gpuhook.io/arch, gpuhook.io/vendor, gpuhook.io/model, gpuhook.io/devices, \
gpuhook.io/capabilities, gpuhook.io/mode, gpuhook.io/uid, gpuhook.io/gid, gpuhook.io/mig, \
gpuhook.io/share, gpuhook.io/driver; else the same keys as GPUHOOK_GPUS=… in process.env) it \
reserves them in the GPU pool it shares with the libvirt hook (key: the container ID): whole \
GPUs, or with gpuhook.io/mig=yes MIG instances, with gpuhook.io/share=yes slots of GPUs the \
host shares. It adds each node to linux.devices with an exact rw allow rule in \
linux.resources.devices (with gpuhook.io/driver=host or cdi also the driver's files as \
mounts), and a createRuntime hook (records the container's init) and a poststop hook \
(frees). On delete it frees too. A request that cannot \
be met is one line on stderr and in the runtime's --log, exit 1, and the real runtime is not \
called. Every other call passes through untouched.")
        .arg(
            clap::Arg::new("args")
                .value_name("RUNTIME-ARGS")
                .num_args(0..)
                .trailing_var_arg(true)
                .allow_hyphen_values(true)
                .help("The real runtime's command line, e.g. --root /run/runc create --bundle DIR ID"),
        )
        .after_help("\
Examples:\n  \
podman run --runtime /usr/bin/gpuhook-runtime --annotation gpuhook.io/gpus=1 IMAGE\n  \
docker run --runtime gpuhook -e GPUHOOK_GPUS=2 -e GPUHOOK_ARCH=hopper IMAGE\n\
Engine snippets: /usr/share/gpuhook/engines/. 'gpuhook list' shows holders with kind oci.")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `gpuhook-libvirt request`'s options are checked as `attach`'s are, refused in their
    /// own words; `--clear` takes no request option, `--share` included.
    #[test]
    fn libvirt_request_options_in_their_words() {
        let parse = |args: &[&str]| LibvirtCli::try_parse_from(args);
        let cli = parse(&[
            "gpuhook-libvirt",
            "request",
            "web1",
            "--count",
            "1",
            "--device",
            "0000:3b:00.0",
            "--device",
            "0000:3c:00.0",
        ])
        .unwrap();
        let LibvirtCommand::Request { request, .. } = cli.command else {
            panic!("not request");
        };
        assert_eq!(
            request.request().unwrap_err().to_string(),
            "--count asks for 1 GPU, fewer than the 2 named by --device"
        );
        let cli = parse(&[
            "gpuhook-libvirt",
            "request",
            "web1",
            "--count",
            "2",
            "--arch",
            "hopper",
        ])
        .unwrap();
        let LibvirtCommand::Request { request, .. } = cli.command else {
            panic!("not request");
        };
        assert_eq!(
            request.request().unwrap().to_string(),
            "2 GPUs, arch == hopper"
        );
        for opt in ["--share", "--mig", "--count=1"] {
            let e = parse(&["gpuhook-libvirt", "request", "web1", "--clear", opt]).unwrap_err();
            assert_eq!(e.kind(), clap::error::ErrorKind::ArgumentConflict, "{opt}");
        }
        assert!(parse(&["gpuhook-libvirt", "request", "web1", "--mig", "--share"]).is_err());
    }
}
