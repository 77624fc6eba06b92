//! A fake host for one tested block, and the set-up verbs a `doc-test` comment may use to
//! bring it to the situation the block shows (docs/guides/testing.md, "The docs under test"):
//!
//! | verb | what it does |
//! |---|---|
//! | `domain NAME [uuid=U] [running] [ATTR=VALUE…] [device=SEL…]` | libvirt's `prepare` of an LXC domain whose `<gpu:gpus>` has those attributes (and `<gpu:device>` children), through `gpuhook hook`; `running`: its init then runs (a process of the harness's) |
//! | `xml NAME [uuid=U] [ATTR=VALUE…] [device=SEL…]` | the domain's XML as `domain` makes it, in `NAME.xml` in the block's directory (nothing run) |
//! | `nova NAME FLAVOR [uuid=U] [KEY=VALUE…]` | `prepare` of a domain as Nova writes it, the flavor's extra specs `KEY=VALUE` |
//! | `stop NAME` | libvirt's `stopped` of that domain |
//! | `container ID [running] [KEY=VALUE…]` | `gpuhook-runtime create` of a bundle with annotations `gpuhook.io/KEY=VALUE` (the real runtime a script that does nothing); `running`: its init then runs |
//! | `kmsg TEXT` | a kernel log record (facility kern, level 4) in the fake host's `/dev/kmsg` |
//! | `config KEY=JSON` | sets a key of the fake host's config (JSON as written, quotes and all) |
//! | `nvidia-smi [PCI FIELD=VALUE…]` | the test bed's `nvidia-smi` stand-in as the config's `nvidia_smi`, answering those counters for that GPU |
//! | `reset-standin [MODE]` | the test bed's reset stand-in as the config's `reset_command` (`ok`, `fail`, `allones`, …) |
//! | `$ COMMAND` | a shell command, in the block's environment |
//! | `as "COMMAND": VERB…` | what the block's `$ COMMAND` (a program the suite cannot run, such as `virsh`) stands for |

use serde_json::{json, Value};
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

/// The fake host a block runs on: its config, state, and the processes that stand for
/// running containers' inits.
pub struct Bed {
    dir: tempfile::TempDir,
    config: PathBuf,
    state: PathBuf,
    dev: PathBuf,
    paths: testbed::HostPaths,
    verbose: bool,
    domains: Vec<(String, String)>,
    inits: Vec<Child>,
    seq: u64,
}

impl Drop for Bed {
    fn drop(&mut self) {
        for c in &mut self.inits {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A name's UUID, the same each run (`gh-a` → `6f1c…`-shaped, from its bytes).
fn uuid_of(name: &str) -> String {
    let h = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    format!(
        "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
        h >> 32,
        (h >> 16) & 0xffff,
        h & 0xfff,
        (h >> 52) & 0xfff,
        h & 0xffff_ffff_ffff
    )
}

impl Bed {
    pub fn new(profile: &str, verbose: bool) -> Result<Bed, String> {
        let fake = testbed::profile(profile).ok_or(format!("no fake host profile {profile}"))?;
        let dir = tempfile::Builder::new()
            .prefix("gpuhook-docs-")
            .tempdir_in(testbed::trusted_tmp())
            .map_err(|e| e.to_string())?;
        let paths = fake
            .create(&dir.path().join("host"))
            .map_err(|e| e.to_string())?;
        let state = dir.path().join("run/state.json");
        let bin = dir.path().join("bin");
        std::fs::create_dir_all(&bin).map_err(|e| e.to_string())?;
        let gpuhook = PathBuf::from(env!("CARGO_BIN_EXE_gpuhook"));
        for name in ["gpuhook", "gpuhook-runtime"] {
            std::os::unix::fs::symlink(&gpuhook, bin.join(name)).map_err(|e| e.to_string())?;
        }
        let runtime = bin.join("real-runtime");
        std::fs::write(&runtime, "#!/bin/sh\nexit 0\n").map_err(|e| e.to_string())?;
        std::fs::set_permissions(&runtime, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| e.to_string())?;
        let mut cfg = paths.config(&state);
        cfg["oci_runtime"] = json!(runtime);
        // No nvidia-smi until a block's `nvidia-smi` verb puts the stand-in there (whatever
        // this machine has in /usr/bin).
        cfg["nvidia_smi"] = json!(paths.root.join("bin/nvidia-smi"));
        let config = dir.path().join("config.json");
        std::fs::write(&config, cfg.to_string()).map_err(|e| e.to_string())?;
        Ok(Bed {
            config,
            state,
            dev: paths.dev.clone(),
            paths,
            verbose,
            domains: Vec::new(),
            inits: Vec::new(),
            seq: 1000,
            dir,
        })
    }

    /// A shell command in the block's environment, its standard output and error as one
    /// stream of lines (in the order written), and its exit status.
    pub fn shell(&self, cmd: &str, stdin: &str) -> Result<(Vec<String>, i32), String> {
        let mut c = Command::new("sh");
        c.arg("-c").arg(cmd);
        self.merged(c, stdin)
    }

    /// A gpuhook program run by the harness itself (its parent, as libvirtd is the hook's).
    fn direct(&self, program: &str, args: &[&str], stdin: &str) -> Result<Vec<String>, String> {
        let mut c = Command::new(self.dir.path().join("bin").join(program));
        c.args(args);
        Ok(self.merged(c, stdin)?.0)
    }

    /// Runs `c` in the block's environment, standard output and error into one pipe.
    fn merged(&self, mut c: Command, stdin: &str) -> Result<(Vec<String>, i32), String> {
        use std::io::{Read, Write};
        let path = format!(
            "{}:{}",
            self.dir.path().join("bin").display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let (r, w) = nix::unistd::pipe().map_err(|e| e.to_string())?;
        let w2 = w.try_clone().map_err(|e| e.to_string())?;
        c.current_dir(self.dir.path())
            .env("PATH", path)
            .env("GPUHOOK_CONFIG", &self.config)
            .env_remove("GPUHOOK_VERBOSE")
            .stdin(Stdio::piped())
            .stdout(Stdio::from(w))
            .stderr(Stdio::from(w2));
        if self.verbose {
            c.env("GPUHOOK_VERBOSE", "1");
        }
        let mut child = c.spawn().map_err(|e| format!("{c:?}: {e}"))?;
        drop(c);
        {
            let mut i = child.stdin.take().expect("stdin");
            let _ = i.write_all(stdin.as_bytes());
        }
        let mut text = String::new();
        std::fs::File::from(r)
            .read_to_string(&mut text)
            .map_err(|e| e.to_string())?;
        let status = child.wait().map_err(|e| e.to_string())?;
        Ok((
            text.lines().map(str::to_owned).collect(),
            status.code().unwrap_or(-1),
        ))
    }

    /// Runs one set-up verb; its output lines.
    pub fn verb(&mut self, line: &str) -> Result<Vec<String>, String> {
        if let Some(cmd) = line.strip_prefix("$ ") {
            return Ok(self.shell(cmd, "")?.0);
        }
        let w = super::markdown::words(line);
        let args: Vec<&str> = w.iter().skip(1).map(String::as_str).collect();
        match w.first().map(String::as_str) {
            Some("domain") => self.domain(&args),
            Some("xml") => self.xml(&args),
            Some("nova") => self.nova(&args),
            Some("stop") => self.stop(args.first().ok_or("stop: no domain named")?),
            Some("container") => self.container(&args),
            Some("kmsg") => self.kmsg(line.trim_start_matches("kmsg").trim()),
            Some("config") => self.config(&[line.trim_start_matches("config").trim()]),
            Some("nvidia-smi") => self.smi(&args),
            Some("reset-standin") => self.reset_standin(&args),
            _ => Err(format!("unknown set-up verb in `{line}`")),
        }
    }

    fn hook(&mut self, name: &str, op: &str, xml: &str) -> Result<Vec<String>, String> {
        let sub = if op == "stopped" { "end" } else { "begin" };
        self.direct("gpuhook", &["hook", name, op, sub, "-"], xml)
    }

    /// A domain's XML from `domain`'s arguments: its name, UUID, XML, and whether it runs.
    fn domain_xml_of(args: &[&str]) -> Result<(String, String, String, bool), String> {
        let (name, rest) = args.split_first().ok_or("domain: no name")?;
        let (mut attrs, mut children, mut running) = (String::new(), String::new(), false);
        let mut uuid = uuid_of(name);
        for a in rest {
            match a.split_once('=') {
                Some(("uuid", v)) => uuid = v.to_owned(),
                Some(("device", v)) => {
                    let key = if v.contains(':') {
                        "pci"
                    } else if v.starts_with("GPU-") {
                        "uuid"
                    } else {
                        "index"
                    };
                    children.push_str(&format!("<gpu:device {key}=\"{v}\"/>"));
                }
                Some((k, v)) => attrs.push_str(&format!(" {k}=\"{v}\"")),
                None if *a == "running" => running = true,
                None => return Err(format!("domain {name}: what is {a}?")),
            }
        }
        let meta =
            format!("<gpu:gpus xmlns:gpu=\"urn:gpuhook:gpu:1\"{attrs}>{children}</gpu:gpus>");
        let xml = domain_xml(name, &uuid, &meta);
        Ok((name.to_string(), uuid, xml, running))
    }

    fn domain(&mut self, args: &[&str]) -> Result<Vec<String>, String> {
        let (name, uuid, xml, running) = Self::domain_xml_of(args)?;
        self.domains.push((name.clone(), xml.clone()));
        let out = self.hook(&name, "prepare", &xml)?;
        if running {
            self.run_init(&uuid)?;
        }
        Ok(out)
    }

    /// `xml NAME …`: the domain's XML as `domain` makes it, in `NAME.xml` (nothing run).
    fn xml(&mut self, args: &[&str]) -> Result<Vec<String>, String> {
        let (name, _, xml, _) = Self::domain_xml_of(args)?;
        std::fs::write(self.dir.path().join(format!("{name}.xml")), xml)
            .map_err(|e| e.to_string())?;
        Ok(Vec::new())
    }

    fn nova(&mut self, args: &[&str]) -> Result<Vec<String>, String> {
        let [name, flavor, rest @ ..] = args else {
            return Err("nova: NAME FLAVOR [KEY=VALUE…]".into());
        };
        let mut uuid = uuid_of(name);
        let mut specs = String::new();
        for a in rest {
            let (k, v) = a
                .split_once('=')
                .ok_or(format!("nova {name}: {a} is not KEY=VALUE"))?;
            if k == "uuid" {
                uuid = v.to_owned();
            } else {
                specs.push_str(&format!(
                    "<nova:extraSpec name=\"{k}\">{v}</nova:extraSpec>"
                ));
            }
        }
        let meta = format!(
            "<nova:instance xmlns:nova=\"http://openstack.org/xmlns/libvirt/nova/1.1\"><nova:name>{name}</nova:name><nova:flavor name=\"{flavor}\"><nova:memory>2048</nova:memory><nova:extraSpecs>{specs}</nova:extraSpecs></nova:flavor></nova:instance>"
        );
        let xml = domain_xml(name, &uuid, &meta);
        self.domains.push((name.to_string(), xml.clone()));
        self.hook(name, "prepare", &xml)
    }

    fn stop(&mut self, name: &str) -> Result<Vec<String>, String> {
        let xml = self
            .domains
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, x)| x.clone())
            .ok_or(format!("stop {name}: no such domain set up"))?;
        self.hook(name, "stopped", &xml)
    }

    fn container(&mut self, args: &[&str]) -> Result<Vec<String>, String> {
        let (id, rest) = args.split_first().ok_or("container: no ID")?;
        let mut annotations = serde_json::Map::new();
        let mut running = false;
        for a in rest {
            match a.split_once('=') {
                Some((k, v)) => {
                    annotations.insert(format!("gpuhook.io/{k}"), json!(v));
                }
                None if *a == "running" => running = true,
                None => return Err(format!("container {id}: what is {a}?")),
            }
        }
        let bundle = self.dir.path().join("bundles").join(id);
        std::fs::create_dir_all(bundle.join("rootfs")).map_err(|e| e.to_string())?;
        let config = json!({
            "ociVersion": "1.0.2",
            "process": {"args": ["sh"], "cwd": "/", "env": ["PATH=/usr/bin:/bin"]},
            "root": {"path": "rootfs"},
            "linux": {"namespaces": [{"type": "pid"}, {"type": "mount"}]},
            "annotations": annotations,
        });
        std::fs::write(bundle.join("config.json"), config.to_string())
            .map_err(|e| e.to_string())?;
        let b = bundle.to_string_lossy().into_owned();
        let out = self.direct("gpuhook-runtime", &["create", "--bundle", &b, id], "")?;
        if running {
            self.run_init(id)?;
        }
        Ok(out)
    }

    /// The holder `key` names (a domain's UUID, a container's ID) runs: its init is a process
    /// of the harness's, as the hook's `started` or the runtime's `createRuntime` records one.
    fn run_init(&mut self, key: &str) -> Result<(), String> {
        let child = Command::new("sleep")
            .arg("600")
            .spawn()
            .map_err(|e| e.to_string())?;
        let p = gpuhook::host::procfs::ProcRef::of(child.id() as i32).ok_or("sleep is gone")?;
        self.inits.push(child);
        let mut st: Value =
            serde_json::from_slice(&std::fs::read(&self.state).map_err(|e| e.to_string())?)
                .map_err(|e| e.to_string())?;
        let rs = st["reservations"]
            .as_object_mut()
            .ok_or("no reservations")?;
        let r = [key.to_owned(), format!("oci:{key}")]
            .iter()
            .find_map(|k| rs.get(k).map(|_| k.clone()))
            .and_then(|k| rs.get_mut(&k))
            .ok_or(format!(
                "no reservation of {key}: its set-up reserved nothing"
            ))?;
        r["phase"] = json!("running");
        r["init"] = json!({"pid": p.pid, "start_time": p.start_time});
        std::fs::write(
            &self.state,
            serde_json::to_vec(&st).map_err(|e| e.to_string())?,
        )
        .map_err(|e| e.to_string())
    }

    fn kmsg(&mut self, text: &str) -> Result<Vec<String>, String> {
        use std::io::Write;
        self.seq += 1;
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dev.join("kmsg"))
            .map_err(|e| e.to_string())?;
        writeln!(f, "4,{},{},-;{text}", self.seq, self.seq * 1000).map_err(|e| e.to_string())?;
        Ok(Vec::new())
    }

    fn config(&mut self, args: &[&str]) -> Result<Vec<String>, String> {
        let mut cfg: Value =
            serde_json::from_slice(&std::fs::read(&self.config).map_err(|e| e.to_string())?)
                .map_err(|e| e.to_string())?;
        for a in args {
            let (k, v) = a
                .split_once('=')
                .ok_or(format!("config: {a} is not KEY=JSON"))?;
            cfg[k] = serde_json::from_str(v).map_err(|e| format!("config {k}: {e}"))?;
        }
        std::fs::write(&self.config, cfg.to_string()).map_err(|e| e.to_string())?;
        Ok(Vec::new())
    }

    /// The fake host's `nvidia-smi` (the test bed's stand-in) as the config's `nvidia_smi`,
    /// answering `FIELD=VALUE` for GPU `PCI`.
    fn smi(&mut self, args: &[&str]) -> Result<Vec<String>, String> {
        let smi = testbed::health::install_smi(&self.paths);
        self.config(&[&format!("nvidia_smi={}", json!(smi))])?;
        if let Some((pci, fields)) = args.split_first() {
            let f: Vec<(&str, &str)> = fields.iter().filter_map(|f| f.split_once('=')).collect();
            testbed::health::smi_answers(&self.paths, pci, &f);
        }
        Ok(Vec::new())
    }

    /// The test bed's reset stand-in as the config's `reset_command`, doing `MODE` (`ok`).
    fn reset_standin(&mut self, args: &[&str]) -> Result<Vec<String>, String> {
        let cmd = testbed::health::standin_command(&self.paths.root);
        self.config(&[&format!("reset_command={cmd}")])?;
        testbed::health::standin_mode(&self.paths, args.first().copied().unwrap_or("ok"));
        Ok(Vec::new())
    }
}

fn domain_xml(name: &str, uuid: &str, meta: &str) -> String {
    format!(
        "<domain type='lxc'>\n  <name>{name}</name>\n  <uuid>{uuid}</uuid>\n  <metadata>\n    {meta}\n  </metadata>\n  <memory unit='KiB'>65536</memory>\n  <os>\n    <type arch='x86_64'>exe</type>\n    <init>/bin/sh</init>\n  </os>\n  <devices>\n    <emulator>/usr/lib/libvirt/libvirt_lxc</emulator>\n    <filesystem type='mount'>\n      <source dir='/'/>\n      <target dir='/'/>\n    </filesystem>\n  </devices>\n</domain>\n"
    )
}
