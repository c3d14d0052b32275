//! The README's commands, run as a user would: `frugal train` and `frugal plan --svg`.
use std::process::Command;

fn frugal(args: &[&str]) -> (bool, String) {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    let out = Command::new(env!("CARGO_BIN_EXE_frugal"))
        .args(args)
        .current_dir(root)
        .output()
        .unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn train_prints_plan_progress_accuracy_and_saves_a_checkpoint() {
    let dir = std::env::temp_dir().join(format!("frugal-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ck = dir.join("ck.safetensors");
    let plot = dir.join("curves.svg");
    let (ok, out) = frugal(&[
        "train",
        "examples/digits-cnn.toml",
        "--budget",
        "2MiB",
        "--epochs",
        "3",
        "--save",
        ck.to_str().unwrap(),
        "--plot",
        plot.to_str().unwrap(),
    ]);
    assert!(ok, "{out}");
    assert!(
        out.contains("lower bound") && out.contains("budget 2 MiB"),
        "{out}"
    );
    assert!(out.contains("epoch 3/3"), "{out}");
    assert!(out.contains("held-out accuracy"), "{out}");
    assert!(std::fs::metadata(&ck).unwrap().len() > 1000);
    assert!(
        std::fs::read_to_string(&plot).unwrap().starts_with("<svg")
            || std::fs::read_to_string(&plot).unwrap().contains("<svg")
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn plan_lists_every_tensor_and_draws_the_arena() {
    let svg = std::env::temp_dir().join(format!("frugal-plan-{}.svg", std::process::id()));
    let (ok, out) = frugal(&[
        "plan",
        "examples/digits-cnn.toml",
        "--batch",
        "64",
        "--svg",
        svg.to_str().unwrap(),
    ]);
    assert!(ok, "{out}");
    for t in [
        "conv1.weight",
        "grad(conv1.weight)",
        "conv1.out",
        "d(fc.out)",
        "pool1.argmax",
        "first",
        "offset",
    ] {
        assert!(out.contains(t), "missing {t} in:\n{out}");
    }
    let s = std::fs::read_to_string(&svg).unwrap();
    assert!(s.matches("<rect class=\"tensor\"").count() > 10);
    std::fs::remove_file(&svg).ok();
}

#[test]
fn too_small_budget_fails_with_the_needed_size() {
    let (ok, out) = frugal(&["train", "examples/digits-cnn.toml", "--budget", "10KiB"]);
    assert!(!ok);
    assert!(
        out.contains("memory budget too small") && out.contains("bytes"),
        "{out}"
    );
}

#[test]
fn malformed_model_names_the_field() {
    let bad = std::env::temp_dir().join(format!("frugal-bad-{}.toml", std::process::id()));
    std::fs::write(&bad, "[model]\ninput = [1, 8, 8]\nloss = \"cross_entropy\"\n[optimizer]\ntype = \"sgd\"\nlr = 0.1\n[[layers]]\ntype = \"conv2d\"\nout = 4\nkernal = 3\n").unwrap();
    let (ok, out) = frugal(&["train", bad.to_str().unwrap()]);
    assert!(!ok);
    assert!(out.contains("kernal"), "{out}");
    std::fs::remove_file(&bad).ok();
}

#[test]
fn int8_batch_split_profiles_every_weight_gradient() {
    let dir = std::env::temp_dir().join(format!("frugal-cli-split-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ck = dir.join("ck.safetensors");
    let (ok, out) = frugal(&[
        "train",
        "examples/digits-mlp.toml",
        "--precision",
        "int8",
        "--batch-split",
        "--epochs",
        "1",
        "--save",
        ck.to_str().unwrap(),
    ]);
    assert!(ok, "{out}");
    assert!(out.contains("batch splitting"), "{out}");
    // One verdict per layer with a weight gradient (the MLP's three Linear layers), each timed.
    for layer in ["fc1", "fc2", "fc3"] {
        let line = out
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{layer}:")))
            .unwrap_or_else(|| panic!("no batch-split line for {layer}:\n{out}"));
        assert!(
            line.contains("µs whole")
                && (line.contains("kept whole") || line.contains("split into chunks of")),
            "{line}"
        );
    }
    assert!(out.contains("held-out accuracy"), "{out}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_model_too_big_for_the_device_fails_with_a_typed_error_not_an_abort() {
    // No --budget: the budget is what the device can give; a 64 × 2^31 weight (512 GiB) fits no plan.
    let dir = std::env::temp_dir().join(format!("frugal-huge-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let model = dir.join("huge.toml");
    std::fs::write(
        &model,
        "[model]\ninput = [1, 8, 8]\nloss = \"cross_entropy\"\n[optimizer]\ntype = \"sgd\"\nlr = 0.1\n\
         [[layers]]\ntype = \"flatten\"\n[[layers]]\ntype = \"linear\"\nout = 2147483648\n\
         [[layers]]\ntype = \"linear\"\nout = 10\n[train]\ndataset = \"digits\"\nepochs = 1\n",
    )
    .unwrap();
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    let out = Command::new(env!("CARGO_BIN_EXE_frugal"))
        .args(["train", model.to_str().unwrap()])
        .current_dir(root)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::remove_dir_all(&dir).ok();
    assert_eq!(
        out.status.code(),
        Some(1),
        "exit by error, not by a signal: {text}"
    );
    assert!(!text.contains("memory allocation of"), "{text}");
    assert!(
        text.contains("memory budget too small") && text.contains("this device can give"),
        "{text}"
    );
}

/// `--device gpu` trains the digits CNN and MLP on the GPU backend (lavapipe without a GPU) to the CPU's
/// held-out accuracy ± 0.5 point, and the checkpoint holds the weights read back from the GPU. Runs in
/// the `gpu` leg of `cargo xtask test` (built with `--features gpu`, an adapter required there).
#[cfg(feature = "gpu")]
#[test]
fn train_on_the_gpu_reaches_the_cpus_accuracy() {
    let dir = std::env::temp_dir().join(format!("frugal-gpu-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let accuracy = |model: &str, device: &str| {
        let ck = dir.join(format!("{device}.safetensors"));
        let (ok, out) = frugal(&[
            "train",
            model,
            "--budget",
            "2MiB",
            "--epochs",
            "3",
            "--device",
            device,
            "--save",
            ck.to_str().unwrap(),
        ]);
        assert!(ok, "{out}");
        assert!(std::fs::metadata(&ck).unwrap().len() > 1000, "{out}");
        let line = out
            .lines()
            .find(|l| l.starts_with("held-out accuracy: "))
            .unwrap_or_else(|| panic!("no accuracy in {out}"));
        let pct: f32 = line["held-out accuracy: ".len()..]
            .split('%')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        (pct, out)
    };
    for model in ["examples/digits-cnn.toml", "examples/digits-mlp.toml"] {
        let (cpu, _) = accuracy(model, "cpu");
        let (gpu, out) = accuracy(model, "gpu");
        assert!(out.contains("gpu: "), "names the adapter: {out}");
        assert!(
            (gpu - cpu).abs() <= 0.5,
            "{model}: GPU {gpu}% vs CPU {cpu}%"
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// `--device auto` measures each layer on the CPU and the GPU and the link between them, prints the
/// placement the DP chose per layer, and trains the digits MLP with it to the CPU's held-out accuracy
/// ± 0.5 point (the mixed plan's GPU layers differ from the CPU's by a few ULP per step, as
/// `--device gpu`'s do). Runs in the `gpu` leg of `cargo xtask test`.
#[cfg(feature = "gpu")]
#[test]
fn train_with_auto_gpu_placement_prints_it_and_reaches_the_cpus_accuracy() {
    let run = |device: &str| {
        let (ok, out) = frugal(&[
            "train",
            "examples/digits-mlp.toml",
            "--budget",
            "2MiB",
            "--epochs",
            "2",
            "--device",
            device,
        ]);
        assert!(ok, "{out}");
        let line = out
            .lines()
            .find(|l| l.starts_with("held-out accuracy: "))
            .unwrap_or_else(|| panic!("no accuracy in {out}"));
        let pct: f32 = line["held-out accuracy: ".len()..]
            .split('%')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        (pct, out)
    };
    let (cpu, _) = run("cpu");
    let (auto, out) = run("auto");
    assert!(out.contains("auto placement on "), "{out}");
    for layer in ["fc1", "fc2", "fc3"] {
        let l = out
            .lines()
            .find(|l| l.trim_start().starts_with(layer))
            .unwrap_or_else(|| panic!("no placement line for {layer}: {out}"));
        assert!(l.contains(" cpu ") || l.contains(" gpu "), "{l}");
    }
    assert!(out.contains("predicted "), "{out}");
    assert!((auto - cpu).abs() <= 0.5, "auto {auto}% vs CPU {cpu}%");
}

/// Without the `gpu` feature, `--device gpu` says how to get it instead of training on the CPU.
#[cfg(not(feature = "gpu"))]
#[test]
fn device_gpu_without_the_feature_says_how_to_build_it() {
    let (ok, out) = frugal(&[
        "train",
        "examples/digits-mlp.toml",
        "--epochs",
        "1",
        "--device",
        "gpu",
    ]);
    assert!(!ok, "{out}");
    assert!(out.contains("--features gpu"), "{out}");
}

/// Sequence models end to end, on the golden tests' tiny GPT and 6 KiB of Genesis: `train` on text
/// (held-out perplexity printed), LoRA fine-tuning from those weights (adapters alone with PEFT names,
/// merged weights the base model loads), and `generate`, the same text for the same seed.
#[test]
fn a_tiny_gpt_trains_fine_tunes_with_lora_and_generates() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    let dir = std::env::temp_dir().join(format!("frugal-seq-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let text = std::fs::read(format!("{root}/data/kjv/genesis.txt")).unwrap();
    std::fs::write(dir.join("text.txt"), &text[..6144]).unwrap();
    let train = "\n[train]\nbatch = 16\nepochs = 2\ndataset = { text = \"text.txt\" }\n";
    for (name, golden) in [("base", "gpt_lora"), ("lora", "gpt_lora")] {
        let mut t = std::fs::read_to_string(format!("{root}/tests/golden/{golden}.toml")).unwrap();
        if name == "base" {
            t = t[..t.find("[lora]").unwrap()].to_string();
        }
        std::fs::write(dir.join(format!("{name}.toml")), t + train).unwrap();
    }
    let p = |f: &str| dir.join(f).to_str().unwrap().to_string();
    let (ok, out) = frugal(&["train", &p("base.toml"), "--save", &p("base.safetensors")]);
    assert!(ok, "{out}");
    assert!(out.contains("perplexity"), "{out}");
    let (ok, out) = frugal(&[
        "train",
        &p("lora.toml"),
        "--weights",
        &p("base.safetensors"),
        "--save",
        &p("merged.safetensors"),
        "--save-adapters",
        &p("adapters.safetensors"),
    ]);
    assert!(ok, "{out}");
    assert!(out.contains("loaded") && out.contains("adapters:"), "{out}");
    let adapters =
        frugal_cli::checkpoint::load_safetensors(&dir.join("adapters.safetensors")).unwrap();
    assert_eq!(adapters.len(), 8);
    assert!(adapters
        .iter()
        .all(|(n, _, _)| n.starts_with("base_model.model.h") && n.contains(".lora_")));
    assert!(std::fs::read_to_string(dir.join("adapter_config.json"))
        .unwrap()
        .contains("\"r\": 4"));
    let gen = |seed: &str| {
        frugal(&[
            "generate",
            &p("base.toml"),
            "--weights",
            &p("merged.safetensors"),
            "--prompt",
            "And God",
            "--length",
            "40",
            "--seed",
            seed,
        ])
    };
    let (ok, a) = gen("3");
    assert!(ok, "{a}");
    assert!(a.starts_with("And God") && a.trim_end().len() >= 40, "{a}");
    assert_eq!(gen("3").1, a);
    // A model without an embedding cannot generate: a typed error, not a panic.
    let (ok, out) = frugal(&[
        "generate",
        "examples/digits-mlp.toml",
        "--weights",
        &p("merged.safetensors"),
    ]);
    assert!(!ok && out.contains("error"), "{out}");
    std::fs::remove_dir_all(&dir).ok();
}

/// The number after `key` and before " B" in `out` (first occurrence).
fn bytes_after(out: &str, key: &str) -> usize {
    let at = out
        .find(key)
        .unwrap_or_else(|| panic!("no {key:?} in {out}"))
        + key.len();
    out[at..]
        .split(" B")
        .next()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no bytes after {key:?} in {out}"))
}

/// `frugal train examples/char-gpt-lora.toml --frozen fp16|int8` (the example's layers on a few
/// windows of text, a few steps): the frozen base is read from a parameter image, the arena shrinks by
/// the frozen f32 bytes (less the region one converted weight takes), the run trains, and the adapters
/// save; `--frozen f32` shrinks it by exactly the frozen bytes.
#[test]
fn lora_fine_tunes_with_its_frozen_base_in_fp16_and_int8_outside_the_arena() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    let dir = std::env::temp_dir().join(format!("frugal-frozen-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let text = std::fs::read(format!("{root}/data/kjv/matthew.txt")).unwrap();
    std::fs::write(dir.join("text.txt"), &text[..64 * 20 + 1]).unwrap();
    // The examples with their data set pointed at the short text (20 windows: 16 train, 4 held out).
    for name in ["char-gpt", "char-gpt-lora"] {
        let t = std::fs::read_to_string(format!("{root}/examples/{name}.toml")).unwrap();
        let t = t.replace("../data/kjv/genesis.txt", "text.txt");
        let t = t.replace("../data/kjv/matthew.txt", "text.txt");
        assert!(t.contains("\"text.txt\""), "{name}: its data set");
        std::fs::write(dir.join(format!("{name}.toml")), t).unwrap();
    }
    let p = |f: &str| dir.join(f).to_str().unwrap().to_string();
    // The base: the example's initial weights (no step), as a checkpoint.
    let (ok, out) = frugal(&[
        "train",
        &p("char-gpt.toml"),
        "--epochs",
        "0",
        "--save",
        &p("base.safetensors"),
    ]);
    assert!(ok, "{out}");
    let run = |frozen: Option<&str>| {
        let mut args = vec![
            "train".to_string(),
            p("char-gpt-lora.toml"),
            "--weights".into(),
            p("base.safetensors"),
            "--batch".into(),
            "4".into(),
            "--epochs".into(),
            "1".into(),
            "--threads".into(),
            "1".into(),
            "--save".into(),
            p("merged.safetensors"),
            "--save-adapters".into(),
            p("adapters.safetensors"),
        ];
        if let Some(f) = frozen {
            args.extend(["--frozen".into(), f.into()]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (ok, out) = frugal(&args);
        assert!(ok, "{frozen:?}: {out}");
        assert!(
            out.contains("epoch 1/1") && out.contains("perplexity"),
            "{out}"
        );
        assert!(out.contains("adapters:"), "{out}");
        out
    };
    let plain = run(None);
    let arena = |out: &str| bytes_after(&out[out.find("plan: ").unwrap()..], "(");
    let plain_arena = arena(&plain);
    assert!(!plain.contains("frozen parameters"), "{plain}");
    let mut frozen_f32 = 0;
    for enc in ["f32", "fp16", "int8"] {
        let out = run(Some(enc));
        assert!(
            out.contains(&format!("{enc} parameter image of")) && out.contains("outside it"),
            "{out}"
        );
        let f32_bytes = bytes_after(&out, "tensors, ");
        let image = bytes_after(&out[out.find("parameter image of ").unwrap()..], "(");
        frozen_f32 = f32_bytes;
        let shrunk = plain_arena - arena(&out);
        match enc {
            // Exactly the frozen bytes (each rounded to the arena's 64-byte alignment).
            "f32" => {
                assert!(
                    shrunk >= f32_bytes && shrunk < f32_bytes + 64 * 64,
                    "{shrunk} {f32_bytes}"
                );
                assert!(image > f32_bytes, "{image}");
            }
            // Less the region the largest converted weight (fc1/fc2: 512×128 f32) takes.
            _ => {
                let region = 512 * 128 * 4;
                assert!(
                    shrunk + region >= f32_bytes && shrunk + region < f32_bytes + 64 * 64,
                    "{enc}: {shrunk} + {region} vs {f32_bytes}"
                );
                assert!(
                    image < f32_bytes * 6 / 10,
                    "{enc}: image {image} of {f32_bytes}"
                );
            }
        }
        let adapters =
            frugal_cli::checkpoint::load_safetensors(&dir.join("adapters.safetensors")).unwrap();
        // Adapters A and B on qkv, proj, fc1, fc2 of 4 blocks and on the head.
        assert_eq!(adapters.len(), 2 * (4 * 4 + 1), "{enc}");
    }
    assert!(
        frozen_f32 > 3 << 20,
        "the base's 0.87 M parameters: {frozen_f32}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// An LSTM and a GRU language model (the golden cases' files with a `[train]` section) train on text
/// (held-out perplexity reported) and generate deterministically from a prompt.
#[test]
fn a_tiny_lstm_and_gru_train_and_generate() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    let dir = std::env::temp_dir().join(format!("frugal-rnn-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let text = std::fs::read(format!("{root}/data/kjv/genesis.txt")).unwrap();
    std::fs::write(dir.join("text.txt"), &text[..6144]).unwrap();
    let train = "\n[train]\nbatch = 16\nepochs = 2\ndataset = { text = \"text.txt\" }\n";
    let p = |f: &str| dir.join(f).to_str().unwrap().to_string();
    for case in ["lstm", "gru"] {
        let t = std::fs::read_to_string(format!("{root}/tests/golden/{case}.toml")).unwrap();
        std::fs::write(dir.join(format!("{case}.toml")), t + train).unwrap();
        let w = p(&format!("{case}.safetensors"));
        let (ok, out) = frugal(&["train", &p(&format!("{case}.toml")), "--save", &w]);
        assert!(ok, "{out}");
        assert!(out.contains("perplexity"), "{out}");
        let names: Vec<String> = frugal_cli::checkpoint::load_safetensors(std::path::Path::new(&w))
            .unwrap()
            .into_iter()
            .map(|(n, _, _)| n)
            .collect();
        for n in ["1_ih.weight", "1_ih.bias", "1.weight_hh_l0", "1.bias_hh_l0"] {
            assert!(
                names.contains(&format!("{case}{n}")),
                "{case}{n} in {names:?}"
            );
        }
        let gen = |seed: &str| {
            frugal(&[
                "generate",
                &p(&format!("{case}.toml")),
                "--weights",
                &w,
                "--prompt",
                "And God",
                "--length",
                "30",
                "--seed",
                seed,
            ])
        };
        let (ok, a) = gen("3");
        assert!(ok, "{a}");
        assert!(a.starts_with("And God") && a.trim_end().len() >= 30, "{a}");
        assert_eq!(gen("3").1, a);
    }
    std::fs::remove_dir_all(&dir).ok();
}
