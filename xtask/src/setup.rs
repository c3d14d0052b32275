//! `cargo xtask setup [--fast] [--check] [LEG…]`: the one list of what the checks need beyond a Rust
//! toolchain, and how to install each piece.
//!
//! Every row of [`TOOLS`] says how its presence (and version, where one matters) is probed, how it is
//! installed, and which legs of `cargo xtask test` need it. Setup probes the rows the asked-for legs need
//! (by default every leg of `cargo xtask test`; `--fast` only the `--fast` ones; a leg name such as
//! `miri` adds that leg), installs what is missing or at an incompatible version — Debian packages with
//! `apt-get` when it runs as root (otherwise it prints the exact commands to run), Rust targets,
//! components and toolchains with `rustup`, Rust programs with `cargo install`, the web demo's packages
//! with `npm ci` — probes again and prints one line per row. Present tools are left alone, so a second
//! run installs nothing. `--check` installs nothing: it only reports (and fails when something is
//! missing). Pinned versions are read from the workspace: `wasm-bindgen-cli` must equal the
//! `wasm-bindgen` crate in `Cargo.lock`, `defmt-print` is released with `defmt` (the firmware's lock
//! file) and reads the same wire format within a major version.
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Instant;

use crate::test::Leg;

/// A version: (major, minor, patch).
pub type Version = (u64, u64, u64);

/// How a tool's presence is probed.
#[derive(Debug)]
pub enum Probe {
    /// Programs on `PATH`; where a version is wanted, it is read from the first one's output for
    /// `--version`.
    Bins(&'static [&'static str]),
    /// A file that a package installs (absolute path).
    File(&'static str),
    /// A Rust target of the toolchain that runs this task (its standard library in the sysroot).
    Target(&'static str),
    /// `cargo ARGS` succeeds (`fmt --version`, `+nightly miri --version`).
    Cargo(&'static [&'static str]),
    /// The Python venv (`python::venv()`) imports what the python leg needs (`python::MODULES`).
    PyVenv,
    /// An npm package installed in `dir` (repository-relative) at the version its `package-lock.json`
    /// names.
    NpmDeps {
        dir: &'static str,
        package: &'static str,
    },
}

/// Which versions are compatible.
#[derive(Debug)]
pub enum Want {
    /// Any version.
    Any,
    /// This version or a later one.
    AtLeast(Version),
    /// Exactly the version of crate `krate` in the lock file `lock` (repository-relative).
    Locked {
        lock: &'static str,
        krate: &'static str,
    },
    /// The major version of crate `krate` in `lock`, at that version or later.
    LockedMajor {
        lock: &'static str,
        krate: &'static str,
    },
}

/// How a tool is installed.
#[derive(Debug)]
pub enum Install {
    /// Debian packages (`apt-get install -y …`; root only).
    Apt(&'static [&'static str]),
    /// `rustup component add NAME`.
    Component(&'static str),
    /// `rustup target add NAME`.
    Target(&'static str),
    /// `rustup toolchain install NAME --profile minimal --component …`.
    Toolchain(&'static str, &'static [&'static str]),
    /// `cargo install CRATE --version V --locked` (V from [`Want`]); without `--locked` when that fails
    /// (a registry mirror may lack an exact locked dependency), same version.
    Cargo(&'static str),
    /// `npm ci` in a repository directory.
    NpmCi(&'static str),
    /// `python3 -m venv` + `pip install -r python/requirements-dev.txt` (`python::install_venv`).
    PyVenv,
}

/// One thing the checks need.
#[derive(Debug)]
pub struct Tool {
    /// What the reports call it.
    pub name: &'static str,
    pub probe: Probe,
    pub want: Want,
    pub install: Install,
    /// The legs that need it.
    pub legs: &'static [Leg],
    /// Said with the install command when it is missing (`""`: nothing to add).
    pub note: &'static str,
}

/// Everything any leg needs beyond `cargo` and `rustc` themselves.
pub const TOOLS: &[Tool] = &[
    Tool {
        name: "rustfmt",
        probe: Probe::Cargo(&["fmt", "--version"]),
        want: Want::Any,
        install: Install::Component("rustfmt"),
        legs: &[Leg::Fmt],
        note: "",
    },
    Tool {
        name: "clippy",
        probe: Probe::Cargo(&["clippy", "--version"]),
        want: Want::Any,
        install: Install::Component("clippy"),
        legs: &[Leg::Clippy],
        note: "",
    },
    // The wasmtime host's build script compiles its guest for wasm32; the browser build too.
    Tool {
        name: "target wasm32-unknown-unknown",
        probe: Probe::Target("wasm32-unknown-unknown"),
        want: Want::Any,
        install: Install::Target("wasm32-unknown-unknown"),
        legs: &[Leg::Tests, Leg::NoStd, Leg::Web],
        note: "",
    },
    // The Python package: an interpreter with venv and pip (Debian splits them out), then the venv.
    Tool {
        name: "python3 (venv, pip)",
        probe: Probe::Bins(&["python3"]),
        want: Want::AtLeast((3, 9, 0)),
        install: Install::Apt(&["python3", "python3-venv", "python3-pip"]),
        legs: &[Leg::Python],
        note: "",
    },
    Tool {
        name: "python venv (maturin, flwr, …)",
        probe: Probe::PyVenv,
        want: Want::Any,
        install: Install::PyVenv,
        legs: &[Leg::Python],
        note: "",
    },
    Tool {
        name: "target thumbv7em-none-eabihf",
        probe: Probe::Target("thumbv7em-none-eabihf"),
        want: Want::Any,
        install: Install::Target("thumbv7em-none-eabihf"),
        legs: &[Leg::NoStd, Leg::FirmwareM4, Leg::FirmwareM7],
        note: "",
    },
    Tool {
        name: "target thumbv6m-none-eabi",
        probe: Probe::Target("thumbv6m-none-eabi"),
        want: Want::Any,
        install: Install::Target("thumbv6m-none-eabi"),
        legs: &[Leg::NoStd, Leg::FirmwareM0],
        note: "",
    },
    Tool {
        name: "target aarch64-unknown-linux-gnu",
        probe: Probe::Target("aarch64-unknown-linux-gnu"),
        want: Want::Any,
        install: Install::Target("aarch64-unknown-linux-gnu"),
        legs: &[Leg::Cross, Leg::Android],
        note: "",
    },
    // The Android host's staticlib (no NDK: the cdylib is left to users' NDKs).
    Tool {
        name: "target aarch64-linux-android",
        probe: Probe::Target("aarch64-linux-android"),
        want: Want::Any,
        install: Install::Target("aarch64-linux-android"),
        legs: &[Leg::Android],
        note: "",
    },
    // The native C-API test and the JNI test on the host JVM.
    Tool {
        name: "gcc",
        probe: Probe::Bins(&["gcc"]),
        want: Want::Any,
        install: Install::Apt(&["gcc"]),
        legs: &[Leg::Android],
        note: "",
    },
    Tool {
        name: "java, javac (JDK 17)",
        probe: Probe::Bins(&["javac", "java"]),
        want: Want::AtLeast((17, 0, 0)),
        install: Install::Apt(&["openjdk-17-jdk-headless"]),
        legs: &[Leg::Android],
        note: "",
    },
    Tool {
        name: "target wasm32-wasip1",
        probe: Probe::Target("wasm32-wasip1"),
        want: Want::Any,
        install: Install::Target("wasm32-wasip1"),
        legs: &[Leg::Cross],
        note: "",
    },
    Tool {
        name: "aarch64-linux-gnu-gcc",
        probe: Probe::Bins(&["aarch64-linux-gnu-gcc"]),
        want: Want::Any,
        install: Install::Apt(&["gcc-aarch64-linux-gnu"]),
        legs: &[Leg::Cross, Leg::Android],
        note: "",
    },
    // Linking for aarch64, and the `-L` root of `qemu-aarch64`.
    Tool {
        name: "aarch64 glibc",
        probe: Probe::File("/usr/aarch64-linux-gnu/lib/libc.so"),
        want: Want::Any,
        install: Install::Apt(&["libc6-dev-arm64-cross"]),
        legs: &[Leg::Cross, Leg::Android],
        note: "",
    },
    // The Hexagon DSP side: Debian's clang targets Hexagon with HVX and links with lld; qemu-user
    // ships qemu-hexagon.
    Tool {
        name: "clang, ld.lld",
        probe: Probe::Bins(&["clang", "ld.lld"]),
        want: Want::Any,
        install: Install::Apt(&["clang", "lld"]),
        legs: &[Leg::Dsp],
        note: "",
    },
    Tool {
        name: "qemu-hexagon",
        probe: Probe::Bins(&["qemu-hexagon"]),
        want: Want::Any,
        install: Install::Apt(&["qemu-user"]),
        legs: &[Leg::Dsp],
        note: "",
    },
    Tool {
        name: "qemu-aarch64",
        probe: Probe::Bins(&["qemu-aarch64"]),
        want: Want::Any,
        install: Install::Apt(&["qemu-user"]),
        legs: &[Leg::Cross, Leg::Android],
        note: "",
    },
    // `node:wasi` with `version: 'preview1'` (the wasm32-wasip1 suite); Playwright. Debian 12's own
    // nodejs is 18: a machine without Node ≥ 20 needs NodeSource's (which bundles npm).
    Tool {
        name: "node, npm",
        probe: Probe::Bins(&["node", "npm"]),
        want: Want::AtLeast((20, 0, 0)),
        install: Install::Apt(&["nodejs", "npm"]),
        legs: &[Leg::Cross, Leg::Web],
        note: "Debian 12's nodejs is 18: take Node ≥ 20 from NodeSource, whose nodejs bundles npm",
    },
    Tool {
        name: "qemu-system-arm",
        probe: Probe::Bins(&["qemu-system-arm"]),
        want: Want::Any,
        install: Install::Apt(&["qemu-system-arm"]),
        legs: &[Leg::FirmwareM4, Leg::FirmwareM0, Leg::FirmwareM7],
        note: "",
    },
    Tool {
        name: "defmt-print",
        probe: Probe::Bins(&["defmt-print"]),
        want: Want::LockedMajor {
            lock: "firmware/Cargo.lock",
            krate: "defmt",
        },
        install: Install::Cargo("defmt-print"),
        legs: &[Leg::FirmwareM4, Leg::FirmwareM0, Leg::FirmwareM7],
        note: "",
    },
    Tool {
        name: "chromium",
        probe: Probe::Bins(&["chromium"]),
        want: Want::Any,
        install: Install::Apt(&["chromium"]),
        legs: &[Leg::Web],
        note: "",
    },
    Tool {
        name: "chromedriver",
        probe: Probe::Bins(&["chromedriver"]),
        want: Want::Any,
        install: Install::Apt(&["chromium-driver"]),
        legs: &[Leg::Web],
        note: "",
    },
    // The wgpu kernels' tests need an adapter: without a GPU, Mesa's lavapipe (Vulkan on the CPU).
    Tool {
        name: "lavapipe (Vulkan on the CPU)",
        probe: Probe::File("/usr/share/vulkan/icd.d/lvp_icd.x86_64.json"),
        want: Want::Any,
        install: Install::Apt(&["mesa-vulkan-drivers"]),
        legs: &[Leg::Gpu],
        note: "",
    },
    Tool {
        name: "Vulkan loader",
        probe: Probe::File("/usr/lib/x86_64-linux-gnu/libvulkan.so.1"),
        want: Want::Any,
        install: Install::Apt(&["libvulkan1"]),
        legs: &[Leg::Gpu],
        note: "",
    },
    Tool {
        name: "wasm-opt",
        probe: Probe::Bins(&["wasm-opt"]),
        want: Want::Any,
        install: Install::Apt(&["binaryen"]),
        legs: &[Leg::Web],
        note: "",
    },
    Tool {
        name: "wasm-bindgen-cli",
        probe: Probe::Bins(&["wasm-bindgen", "wasm-bindgen-test-runner"]),
        want: Want::Locked {
            lock: "Cargo.lock",
            krate: "wasm-bindgen",
        },
        install: Install::Cargo("wasm-bindgen-cli"),
        legs: &[Leg::Web],
        note: "",
    },
    Tool {
        name: "web-demo npm packages",
        probe: Probe::NpmDeps {
            dir: "web-demo",
            package: "playwright-core",
        },
        want: Want::Any,
        install: Install::NpmCi("web-demo"),
        legs: &[Leg::Web],
        note: "",
    },
    Tool {
        name: "nightly + miri",
        probe: Probe::Cargo(&["+nightly", "miri", "--version"]),
        want: Want::Any,
        install: Install::Toolchain("nightly", &["miri", "rust-src"]),
        legs: &[Leg::Miri],
        note: "",
    },
    Tool {
        name: "cargo-fuzz",
        probe: Probe::Bins(&["cargo-fuzz"]),
        want: Want::Any,
        install: Install::Cargo("cargo-fuzz"),
        legs: &[Leg::Fuzz],
        note: "runs on nightly (the nightly + miri row installs it)",
    },
    Tool {
        name: "nightly (fuzz)",
        probe: Probe::Cargo(&["+nightly", "--version"]),
        want: Want::Any,
        install: Install::Toolchain("nightly", &[]),
        legs: &[Leg::Fuzz],
        note: "",
    },
];

/// The repository root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The first `major.minor[.patch]` in `text` (a leading `v` allowed), e.g. `wasm-bindgen 0.2.130` or
/// `v20.20.2`.
pub fn parse_version(text: &str) -> Option<Version> {
    text.split(|c: char| c.is_whitespace() || c == ',' || c == '(')
        .find_map(|word| {
            let word = word.strip_prefix('v').unwrap_or(word);
            let mut parts = word.split('.');
            let major = parts.next()?.parse().ok()?;
            let minor = parts.next()?.parse().ok()?;
            let patch = match parts.next() {
                None => 0,
                Some(p) => {
                    let digits: String = p.chars().take_while(char::is_ascii_digit).collect();
                    digits.parse().ok()?
                }
            };
            Some((major, minor, patch))
        })
}

/// The version of crate `krate` in the text of a `Cargo.lock` (the first entry when there are several).
pub fn locked_version(lock: &str, krate: &str) -> Option<String> {
    let name = format!("name = \"{krate}\"");
    let mut lines = lock.lines();
    while let Some(l) = lines.next() {
        if l.trim() == name {
            let v = lines.next()?.trim().strip_prefix("version = \"")?;
            return Some(v.strip_suffix('"')?.to_string());
        }
    }
    None
}

/// The `"version"` of the entry `"node_modules/PACKAGE"` in a `package-lock.json` (`packages`), or of
/// a `package.json` when `package` is `None` (its top-level `"version"`).
fn npm_version(json: &str, package: Option<&str>) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(json).ok()?;
    let entry = match package {
        Some(p) => &v["packages"][format!("node_modules/{p}")],
        None => &v,
    };
    entry["version"].as_str().map(str::to_owned)
}

fn fmt_version(v: Version) -> String {
    format!("{}.{}.{}", v.0, v.1, v.2)
}

fn lock_version(lock: &str, krate: &str) -> Result<String, String> {
    let path = root().join(lock);
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    locked_version(&text, krate).ok_or_else(|| format!("{lock} has no `{krate}` package"))
}

impl Want {
    /// The version `cargo install` pins, read from the workspace.
    fn pin(&self) -> Result<Option<String>, String> {
        match self {
            Want::Locked { lock, krate } | Want::LockedMajor { lock, krate } => {
                lock_version(lock, krate).map(Some)
            }
            Want::Any | Want::AtLeast(_) => Ok(None),
        }
    }

    /// Whether `found` is compatible; `Err` says what is wanted instead.
    fn accepts(&self, found: Version) -> Result<(), String> {
        let (ok, want) = match self {
            Want::Any => (true, String::new()),
            Want::AtLeast(min) => (found >= *min, format!("≥ {}", fmt_version(*min))),
            Want::Locked { lock, krate } => {
                let v = lock_version(lock, krate)?;
                let pinned = parse_version(&v).ok_or_else(|| format!("{lock}: bad version {v}"))?;
                (found == pinned, format!("= {v} ({krate} in {lock})"))
            }
            Want::LockedMajor { lock, krate } => {
                let v = lock_version(lock, krate)?;
                let pinned = parse_version(&v).ok_or_else(|| format!("{lock}: bad version {v}"))?;
                (
                    found.0 == pinned.0 && found >= pinned,
                    format!("{}.x ≥ {v} ({krate} in {lock})", pinned.0),
                )
            }
        };
        if ok {
            Ok(())
        } else {
            Err(format!("found {}, need {want}", fmt_version(found)))
        }
    }
}

fn on_path(bin: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(bin))
        .find(|p| p.is_file())
}

fn output(cmd: &mut Command) -> Option<String> {
    let o = cmd.stdin(Stdio::null()).output().ok()?;
    o.status.success().then(|| {
        let mut s = String::from_utf8_lossy(&o.stdout).into_owned();
        s.push_str(&String::from_utf8_lossy(&o.stderr));
        s
    })
}

/// The sysroot of the toolchain that runs this task (cargo passes `RUSTUP_TOOLCHAIN` down).
fn sysroot() -> Option<&'static Path> {
    static SYSROOT: OnceLock<Option<PathBuf>> = OnceLock::new();
    SYSROOT
        .get_or_init(|| {
            let s = output(Command::new("rustc").args(["--print", "sysroot"]))?;
            Some(PathBuf::from(s.trim()))
        })
        .as_deref()
}

impl Tool {
    /// What is installed: `Ok(description)` when usable, `Err(why not)` otherwise.
    pub fn probe(&self) -> Result<String, String> {
        match &self.probe {
            Probe::Bins(bins) => {
                let mut found = Vec::new();
                for b in *bins {
                    found.push(on_path(b).ok_or_else(|| format!("`{b}` not on PATH"))?);
                }
                if matches!(self.want, Want::Any) {
                    return Ok(found[0].display().to_string());
                }
                let text = output(Command::new(&found[0]).arg("--version"))
                    .ok_or_else(|| format!("`{} --version` failed", bins[0]))?;
                let v = parse_version(&text).ok_or_else(|| {
                    format!("no version in `{} --version`: {}", bins[0], text.trim())
                })?;
                self.want.accepts(v)?;
                Ok(fmt_version(v))
            }
            Probe::File(f) => {
                if Path::new(f).is_file() {
                    Ok(f.to_string())
                } else {
                    Err(format!("{f} missing"))
                }
            }
            Probe::Target(t) => {
                let sysroot = sysroot().ok_or("`rustc --print sysroot` failed")?;
                if sysroot.join("lib/rustlib").join(t).join("lib").is_dir() {
                    Ok("installed".into())
                } else {
                    Err(format!("not installed in {}", sysroot.display()))
                }
            }
            Probe::Cargo(args) => output(Command::new("cargo").args(*args))
                .map(|s| s.lines().next().unwrap_or("").trim().to_string())
                .ok_or_else(|| format!("`cargo {}` failed", args.join(" "))),
            Probe::PyVenv => {
                let py = crate::python::python();
                if !py.is_file() {
                    return Err(format!("{} missing", py.display()));
                }
                output(Command::new(&py).args(["-c", crate::python::MODULES]))
                    .map(|_| crate::python::venv().display().to_string())
                    .ok_or_else(|| {
                        format!("`{}` fails in {}", crate::python::MODULES, py.display())
                    })
            }
            Probe::NpmDeps { dir, package } => {
                let d = root().join(dir);
                let lock = std::fs::read_to_string(d.join("package-lock.json"))
                    .map_err(|e| format!("{dir}/package-lock.json: {e}"))?;
                let want = npm_version(&lock, Some(package))
                    .ok_or_else(|| format!("{dir}/package-lock.json names no {package}"))?;
                let have = std::fs::read_to_string(
                    d.join("node_modules").join(package).join("package.json"),
                )
                .ok()
                .and_then(|j| npm_version(&j, None))
                .ok_or_else(|| format!("{package} not installed in {dir}/node_modules"))?;
                if have == want {
                    Ok(format!("{package} {have}"))
                } else {
                    Err(format!(
                        "{package} {have} installed, the lock file says {want}"
                    ))
                }
            }
        }
    }

    /// The install command, with the note when there is one.
    pub fn hint(&self) -> String {
        if self.note.is_empty() {
            self.command()
        } else {
            format!("{}; {}", self.command(), self.note)
        }
    }

    /// The exact command that installs it (Debian packages: as root).
    pub fn command(&self) -> String {
        let pin = self.want.pin().ok().flatten();
        match &self.install {
            Install::Apt(pkgs) => format!("apt-get install -y {}", pkgs.join(" ")),
            Install::Component(c) => format!("rustup component add {c}"),
            Install::Target(t) => format!("rustup target add {t}"),
            Install::Toolchain(t, cs) => format!(
                "rustup toolchain install {t} --profile minimal --component {}",
                cs.join(",")
            ),
            Install::Cargo(c) => match pin {
                Some(v) => format!("cargo install {c} --version {v} --locked"),
                None => format!("cargo install {c} --locked"),
            },
            Install::NpmCi(d) => format!("(cd {d} && npm ci --no-audit --no-fund)"),
            Install::PyVenv => format!(
                "python3 -m venv {v} && {v}/bin/python -m pip install -r python/requirements-dev.txt",
                v = crate::python::venv().display()
            ),
        }
    }
}

/// What was found for the tools some legs need.
pub struct Status {
    rows: Vec<(&'static Tool, Result<String, String>)>,
}

impl Status {
    /// Probes every tool that one of `legs` needs.
    pub fn of(legs: &[Leg]) -> Status {
        Status {
            rows: needed(legs).map(|t| (t, t.probe())).collect(),
        }
    }

    /// The tools that are missing or at an incompatible version.
    pub fn missing(&self) -> Vec<&'static Tool> {
        self.rows
            .iter()
            .filter(|(_, r)| r.is_err())
            .map(|(t, _)| *t)
            .collect()
    }

    /// Why `leg` cannot run (its missing tools), or `None` when it can.
    pub fn blocks(&self, leg: Leg) -> Option<String> {
        let names: Vec<&str> = self
            .rows
            .iter()
            .filter(|(t, r)| r.is_err() && t.legs.contains(&leg))
            .map(|(t, _)| t.name)
            .collect();
        (!names.is_empty()).then(|| format!("missing {}", names.join(", ")))
    }

    /// One line per tool: ok / MISSING / VERSION (present, incompatible), the tool, the legs that need it,
    /// what was found or why not with the command that installs it.
    pub fn print(&self) {
        for (t, r) in &self.rows {
            let legs: Vec<&str> = t.legs.iter().map(|l| l.name()).collect();
            let (mark, what) = match r {
                Ok(s) => ("ok", s.clone()),
                // `Want::accepts` says "found V, need …".
                Err(e) if e.starts_with("found ") => ("VERSION", format!("{e} — {}", t.hint())),
                Err(e) => ("MISSING", format!("{e} — {}", t.hint())),
            };
            eprintln!("  {mark:<8} {:<32} {:<24} {what}", t.name, legs.join(","));
        }
    }
}

/// The tools that one of `legs` needs, in table order.
pub fn needed(legs: &[Leg]) -> impl Iterator<Item = &'static Tool> + '_ {
    TOOLS
        .iter()
        .filter(move |t| t.legs.iter().any(|l| legs.contains(l)))
}

/// The names of the tools `leg` needs.
pub fn needs(leg: Leg) -> Vec<&'static str> {
    needed(&[leg]).map(|t| t.name).collect()
}

fn is_root() -> bool {
    output(Command::new("id").arg("-u")).is_some_and(|s| s.trim() == "0")
}

/// Runs `cmd` (no standard input), echoing it; an error names it and its exit status.
pub(crate) fn run(cmd: &mut Command) -> Result<(), String> {
    eprintln!("$ {cmd:?}");
    let st = cmd
        .stdin(Stdio::null())
        .status()
        .map_err(|e| format!("cannot run {:?}: {e}", cmd.get_program()))?;
    if st.success() {
        Ok(())
    } else {
        Err(format!("{cmd:?} failed ({st})"))
    }
}

/// Installs `missing` (apt first: Node comes before `npm ci`). Returns the commands left for the user
/// (Debian packages when not root) and the installs that failed.
fn install(missing: &[&'static Tool]) -> (Vec<String>, Vec<String>) {
    let (mut todo, mut failed) = (Vec::new(), Vec::new());
    let mut apt: Vec<&str> = Vec::new();
    for t in missing {
        if let Install::Apt(pkgs) = t.install {
            for p in pkgs {
                if !apt.contains(p) {
                    apt.push(p);
                }
            }
        }
    }
    if !apt.is_empty() {
        let pkgs = apt.join(" ");
        if on_path("apt-get").is_none() {
            todo.push(format!(
                "install with your package manager (Debian names): {pkgs}"
            ));
        } else if !is_root() {
            todo.push(format!(
                "sudo apt-get update && sudo apt-get install -y {pkgs}"
            ));
        } else {
            let r = run(Command::new("apt-get")
                .args(["update", "-qq"])
                .env("DEBIAN_FRONTEND", "noninteractive"))
            .and_then(|()| {
                run(Command::new("apt-get")
                    .args(["install", "-y", "-qq"])
                    .args(&apt)
                    .env("DEBIAN_FRONTEND", "noninteractive"))
            });
            if let Err(e) = r {
                failed.push(e);
            }
        }
    }
    for t in missing {
        let r = match t.install {
            Install::Apt(_) => continue,
            Install::Component(c) => run(Command::new("rustup").args(["component", "add", c])),
            Install::Target(tg) => run(Command::new("rustup").args(["target", "add", tg])),
            Install::Toolchain(tc, cs) => run(Command::new("rustup")
                .args([
                    "toolchain",
                    "install",
                    tc,
                    "--profile",
                    "minimal",
                    "--component",
                ])
                .arg(cs.join(","))
                .env_remove("RUSTUP_TOOLCHAIN")),
            Install::Cargo(c) => t.want.pin().and_then(|pin| {
                let mut args = vec!["install", c];
                if let Some(v) = &pin {
                    args.extend(["--version", v.as_str()]);
                }
                run(Command::new("cargo").args(&args).arg("--locked")).or_else(|e| {
                    eprintln!("{e}; again without --locked (same version)");
                    run(Command::new("cargo").args(&args))
                })
            }),
            Install::NpmCi(d) => run(Command::new("npm").current_dir(root().join(d)).args([
                "ci",
                "--no-audit",
                "--no-fund",
            ])),
            Install::PyVenv => crate::python::install_venv(),
        };
        if let Err(e) = r {
            failed.push(format!("{}: {e}", t.name));
        }
    }
    (todo, failed)
}

/// Probes what `legs` need, installs what is missing, probes again and prints the result. The returned
/// status says what is still missing (a caller decides whether that is an error).
pub fn ensure(legs: &[Leg]) -> Status {
    let t0 = Instant::now();
    let before = Status::of(legs);
    let missing = before.missing();
    if missing.is_empty() {
        before.print();
        eprintln!(
            "setup: everything present ({} checked in {:.1} s)",
            before.rows.len(),
            t0.elapsed().as_secs_f64()
        );
        return before;
    }
    eprintln!(
        "setup: installing {}",
        missing
            .iter()
            .map(|t| t.name)
            .collect::<Vec<_>>()
            .join(", ")
    );
    let (todo, failed) = install(&missing);
    let after = Status::of(legs);
    after.print();
    for f in &failed {
        eprintln!("setup: failed: {f}");
    }
    if !todo.is_empty() {
        eprintln!("setup: run these as a user who may install packages, then again:");
        for c in &todo {
            eprintln!("  {c}");
        }
    }
    eprintln!(
        "setup: {} of {} present after {:.1} s",
        after.rows.len() - after.missing().len(),
        after.rows.len(),
        t0.elapsed().as_secs_f64()
    );
    after
}

/// `cargo xtask setup [--fast] [--check] [LEG…]`.
pub fn main(args: &[String]) -> Result<(), String> {
    let usage = || {
        let legs: Vec<&str> = Leg::ALL.iter().map(|l| l.name()).collect();
        format!(
            "usage: cargo xtask setup [--fast] [--check] [LEG…]; legs: {}",
            legs.join(", ")
        )
    };
    let mut fast = false;
    let mut check = false;
    let mut extra = Vec::new();
    for a in args {
        match a.as_str() {
            "--fast" => fast = true,
            "--check" => check = true,
            name => extra.push(Leg::parse(name).ok_or_else(usage)?),
        }
    }
    let mut legs: Vec<Leg> = if extra.is_empty() {
        Leg::TEST
            .iter()
            .copied()
            .filter(|l| !fast || l.fast())
            .collect()
    } else {
        Vec::new()
    };
    legs.extend(extra);
    let status = if check {
        let s = Status::of(&legs);
        s.print();
        s
    } else {
        ensure(&legs)
    };
    let missing = status.missing();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "missing: {}",
            missing
                .iter()
                .map(|t| t.name)
                .collect::<Vec<_>>()
                .join(", ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_read_from_tool_banners() {
        assert_eq!(parse_version("wasm-bindgen 0.2.130"), Some((0, 2, 130)));
        assert_eq!(parse_version("v20.20.2\n"), Some((20, 20, 2)));
        assert_eq!(
            parse_version("defmt-print 1.2.0\nsupported defmt versions: 3, 4"),
            Some((1, 2, 0))
        );
        assert_eq!(parse_version("tool 1.4"), Some((1, 4, 0)));
        assert_eq!(parse_version("x 2.0.0-beta.1"), Some((2, 0, 0)));
        assert_eq!(parse_version("no version here 3"), None);
    }

    #[test]
    fn the_locked_version_is_the_line_after_the_name() {
        let lock = "[[package]]\nname = \"wasm-bindgen-macro\"\nversion = \"0.2.9\"\n\n\
                    [[package]]\nname = \"wasm-bindgen\"\nversion = \"0.2.130\"\nsource = \"x\"\n";
        assert_eq!(
            locked_version(lock, "wasm-bindgen").as_deref(),
            Some("0.2.130")
        );
        assert_eq!(
            locked_version(lock, "wasm-bindgen-macro").as_deref(),
            Some("0.2.9")
        );
        assert_eq!(locked_version(lock, "wasm"), None);
    }

    #[test]
    fn the_workspace_pins_wasm_bindgen_cli_to_the_crate() {
        let v = Want::Locked {
            lock: "Cargo.lock",
            krate: "wasm-bindgen",
        }
        .pin()
        .unwrap()
        .unwrap();
        let pinned = parse_version(&v).unwrap();
        let want = Want::Locked {
            lock: "Cargo.lock",
            krate: "wasm-bindgen",
        };
        assert!(want.accepts(pinned).is_ok());
        assert!(want.accepts((pinned.0, pinned.1, pinned.2 + 1)).is_err());
    }

    #[test]
    fn same_major_and_not_older_is_compatible() {
        let want = Want::LockedMajor {
            lock: "firmware/Cargo.lock",
            krate: "defmt",
        };
        let v = parse_version(&want.pin().unwrap().unwrap()).unwrap();
        assert!(want.accepts(v).is_ok());
        assert!(want.accepts((v.0, v.1 + 1, 0)).is_ok());
        assert!(want.accepts((v.0 + 1, 0, 0)).is_err());
        assert!(Want::AtLeast((20, 0, 0)).accepts((18, 20, 4)).is_err());
        assert!(Want::AtLeast((20, 0, 0)).accepts((20, 0, 0)).is_ok());
    }

    #[test]
    fn npm_versions_come_from_the_lock_entry_and_the_installed_manifest() {
        let lock = r#"{"packages": {"": {"version": "0.1.0"},
            "node_modules/playwright-core": {"version": "1.65.1", "dev": true}}}"#;
        assert_eq!(
            npm_version(lock, Some("playwright-core")).as_deref(),
            Some("1.65.1")
        );
        assert_eq!(
            npm_version(r#"{"name": "p", "version": "1.2.3"}"#, None).as_deref(),
            Some("1.2.3")
        );
        // An entry without a version is not given the next entry's (a text search would read b's),
        // and a file that is not JSON names no version.
        let no_version = r#"{"packages": {"node_modules/a": {"dev": true},
            "node_modules/b": {"version": "9.9.9"}}}"#;
        assert_eq!(npm_version(no_version, Some("a")), None);
        assert_eq!(npm_version(r#"{"version": "1.2"#, None), None);
    }

    #[test]
    fn every_tool_is_needed_and_a_missing_one_blocks_only_its_legs() {
        for t in TOOLS {
            assert!(!t.legs.is_empty(), "{} is needed by no leg", t.name);
        }
        // A missing tool blocks exactly the legs that need it.
        let wb = TOOLS.iter().find(|t| t.name == "wasm-bindgen-cli").unwrap();
        let s = Status {
            rows: vec![(wb, Err("not on PATH".into()))],
        };
        assert!(s.blocks(Leg::Web).unwrap().contains("wasm-bindgen-cli"));
        assert_eq!(s.blocks(Leg::Cross), None);
    }

    #[test]
    fn fast_legs_need_only_rustup_pieces() {
        let fast: Vec<Leg> = Leg::TEST.iter().copied().filter(|l| l.fast()).collect();
        for t in needed(&fast) {
            assert!(
                matches!(t.install, Install::Component(_) | Install::Target(_)),
                "--fast needs {}, which rustup does not install",
                t.name
            );
        }
    }

    #[test]
    fn install_commands_carry_the_pinned_version() {
        let wb = TOOLS.iter().find(|t| t.name == "wasm-bindgen-cli").unwrap();
        let v = lock_version("Cargo.lock", "wasm-bindgen").unwrap();
        assert_eq!(
            wb.command(),
            format!("cargo install wasm-bindgen-cli --version {v} --locked")
        );
    }
}
