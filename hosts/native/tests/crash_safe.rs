//! Crash-safe state: a process writing checkpoints and plan tables in a loop is killed with SIGKILL at
//! random points, again and again; after every kill both files load, each as one complete version
//! (never a torn mix of two, never a truncated file).
//!
//! The writer is this test binary re-executed (`--exact writer_child`) with `FRUGAL_CRASH_DIR` set.
#![cfg(unix)]
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use frugal_cli::checkpoint::{load_safetensors, save_safetensors};
use frugal_cli::fsutil::write_atomic;
use frugal_core::format::{decode_plan_table, encode_plan_table, PlanEntry, PlanTable};
use frugal_core::graph::Graph;
use frugal_core::model::{Dims, LayerKind, LayerSpec, LossKind, ModelSpec, OptimizerSpec, Src};
use frugal_core::plan::Plan;

const ENV: &str = "FRUGAL_CRASH_DIR";
/// Values per checkpoint tensor: 1 MiB files, so a kill often lands inside a write.
const N: usize = 1 << 18;

fn spec(seed: u64) -> ModelSpec {
    ModelSpec {
        input: Dims::flat(4),
        layers: vec![LayerSpec {
            name: "fc".into(),
            kind: LayerKind::Linear { out: 2, bias: true },
            inputs: vec![Src::Input],
            trainable: true,
            update: frugal_core::model::Update::All,
        }],
        loss: LossKind::SoftmaxCrossEntropy,
        optimizer: OptimizerSpec::Sgd {
            lr: 0.1,
            momentum: 0.0,
            weight_decay: 0.0,
        },
        seed,
    }
}

/// Version `k` of the plan table: the model's seed is `k`, one entry per `1 + k % 3`.
fn table(k: u64) -> Vec<u8> {
    let s = spec(k);
    let entries = (0..1 + k % 3)
        .map(|i| PlanEntry {
            budget: 1 << (10 + i),
            plan: Plan::new(Graph::new(&s, 1 + i as usize).unwrap()),
        })
        .collect();
    encode_plan_table(&s, &PlanTable { entries })
}

/// The child: writes version 1, 2, 3, … of both files until killed.
#[test]
fn writer_child() {
    let Ok(dir) = std::env::var(ENV) else {
        return; // only runs when re-executed by the test below
    };
    let dir = Path::new(&dir);
    let mut vals = vec![0f32; N];
    for k in 1u64.. {
        vals.iter_mut().for_each(|v| *v = k as f32);
        let shape = [N];
        save_safetensors(
            &dir.join("ck.safetensors"),
            &[("w", &shape[..], &vals[..])],
            None,
        )
        .unwrap();
        write_atomic(&dir.join("plans.frgt"), &table(k)).unwrap();
    }
}

/// xorshift64*: the kill delays.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

/// The checkpoint's version: every value equals it (a torn file would mix two, or not load).
fn checkpoint_version(p: &Path) -> u64 {
    let t = load_safetensors(p).unwrap_or_else(|e| panic!("checkpoint does not load: {e}"));
    assert_eq!(t.len(), 1);
    let (name, shape, v) = &t[0];
    assert_eq!((name.as_str(), shape.as_slice()), ("w", &[N][..]));
    let k = v[0];
    assert!(v.iter().all(|&x| x == k), "checkpoint mixes versions");
    k as u64
}

fn table_version(p: &Path) -> u64 {
    let bytes = std::fs::read(p).unwrap();
    let (s, t) =
        decode_plan_table(&bytes).unwrap_or_else(|e| panic!("plan table does not load: {e}"));
    assert_eq!(t.entries.len() as u64, 1 + s.seed % 3);
    assert_eq!(
        bytes,
        table(s.seed),
        "plan table is not exactly version {}",
        s.seed
    );
    s.seed
}

#[test]
fn sigkilled_writer_always_leaves_a_complete_old_or_new_file() {
    let dir = std::env::temp_dir().join(format!("frugal-crash-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let exe = std::env::current_exe().unwrap();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ std::process::id() as u64);
    let (ck, tb) = (dir.join("ck.safetensors"), dir.join("plans.frgt"));
    let (mut last_ck, mut last_tb) = (0, 0);
    let mut kills = 0;
    let start = Instant::now();
    while kills < 60 {
        // Each run starts from no files, so what a kill leaves is this run's doing.
        std::fs::remove_file(&ck).ok();
        std::fs::remove_file(&tb).ok();
        let mut child = Command::new(&exe)
            .args(["--exact", "writer_child", "--nocapture", "--test-threads=1"])
            .env(ENV, &dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // Every kill waits for the run's first files, and one run in four for its second versions
        // (so some kills land between versions however slow the machine is); then 0–40 ms more.
        let wait_for = if kills % 4 == 3 { 2 } else { 1 };
        while !(ck.exists()
            && tb.exists()
            && checkpoint_version(&ck) >= wait_for
            && table_version(&tb) >= wait_for)
        {
            assert!(
                start.elapsed() < Duration::from_secs(300),
                "the writer never wrote version {wait_for}"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_micros(rng.next() % 40_000));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        kills += 1;
        // Each restart begins again at version 1: the file holds the last complete version written.
        let (c, t) = (checkpoint_version(&ck), table_version(&tb));
        assert!(c >= 1 && t >= 1);
        last_ck = last_ck.max(c);
        last_tb = last_tb.max(t);
    }
    // Some runs got past version 1, so kills did land between versions and not only before the first.
    assert!(last_ck > 1 && last_tb > 1, "{last_ck} {last_tb}");
    std::fs::remove_dir_all(&dir).ok();
}
