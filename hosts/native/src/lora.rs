//! LoRA adapters out of a trained model: merged into the base weights (`W + (alpha/rank)·B·A`, the
//! adapters dropped — a checkpoint the base model file loads), or alone in PEFT's layout
//! (`base_model.model.{layer}.lora_A.weight` / `lora_B.weight` and an `adapter_config.json`).
use frugal_core::model::{LayerKind, ModelSpec};

/// Named tensors: (name, shape, values).
pub type Tensors = Vec<(String, Vec<usize>, Vec<f32>)>;

fn find<'a>(t: &'a Tensors, name: &str) -> Option<&'a (String, Vec<usize>, Vec<f32>)> {
    t.iter().find(|(n, _, _)| n == name)
}

/// Why adapters cannot be merged or exported.
#[derive(Debug, PartialEq, Eq)]
pub struct LoraError(pub String);

impl std::fmt::Display for LoraError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for LoraError {}

/// The LoRA layers of `spec`: (name, rank, scale = alpha / rank).
fn lora_layers(spec: &ModelSpec) -> impl Iterator<Item = (&str, usize, f32)> {
    spec.layers.iter().filter_map(|l| match l.kind {
        LayerKind::LoraLinear { rank, alpha, .. } => {
            Some((l.name.as_str(), rank as usize, alpha / rank as f32))
        }
        _ => None,
    })
}

/// `tensors` with every LoRA layer's adapters merged into its weight (`W += scale·B·A`, summed in
/// f64) and the adapter tensors removed.
pub fn merge(spec: &ModelSpec, tensors: &Tensors) -> Result<Tensors, LoraError> {
    let mut out: Tensors = tensors
        .iter()
        .filter(|(n, _, _)| !n.contains(".lora_"))
        .cloned()
        .collect();
    for (name, rank, scale) in lora_layers(spec) {
        let get = |suffix: &str| {
            find(tensors, &format!("{name}.{suffix}"))
                .ok_or_else(|| LoraError(format!("no tensor {name}.{suffix} to merge")))
        };
        let (a, b) = (get("lora_A.weight")?, get("lora_B.weight")?);
        let w = out
            .iter_mut()
            .find(|(n, _, _)| *n == format!("{name}.weight"))
            .ok_or_else(|| LoraError(format!("no tensor {name}.weight to merge into")))?;
        let (fout, fin) = match w.1[..] {
            [o, i] => (o, i),
            _ => return Err(LoraError(format!("{name}.weight is not a matrix"))),
        };
        if a.1 != [rank, fin] || b.1 != [fout, rank] {
            return Err(LoraError(format!(
                "{name}: adapters {:?} and {:?} do not fit a [{fout}, {fin}] weight at rank {rank}",
                a.1, b.1
            )));
        }
        for o in 0..fout {
            for i in 0..fin {
                let d: f64 = (0..rank)
                    .map(|r| b.2[o * rank + r] as f64 * a.2[r * fin + i] as f64)
                    .sum();
                w.2[o * fin + i] += (scale as f64 * d) as f32;
            }
        }
    }
    Ok(out)
}

/// The adapters alone, with PEFT's tensor names.
pub fn adapters(spec: &ModelSpec, tensors: &Tensors) -> Result<Tensors, LoraError> {
    let mut out = Tensors::new();
    for (name, _, _) in lora_layers(spec) {
        for part in ["lora_A.weight", "lora_B.weight"] {
            let (_, s, v) = find(tensors, &format!("{name}.{part}"))
                .ok_or_else(|| LoraError(format!("no tensor {name}.{part}")))?;
            out.push((
                format!("base_model.model.{name}.{part}"),
                s.clone(),
                v.clone(),
            ));
        }
    }
    Ok(out)
}

/// PEFT's `adapter_config.json` for these adapters.
pub fn adapter_config(rank: u32, alpha: f32, targets: &[String]) -> String {
    let t: Vec<String> = targets.iter().map(|t| format!("{t:?}")).collect();
    format!(
        "{{\n  \"peft_type\": \"LORA\",\n  \"task_type\": \"CAUSAL_LM\",\n  \"r\": {rank},\n  \"lora_alpha\": {alpha},\n  \"lora_dropout\": 0.0,\n  \"bias\": \"none\",\n  \"fan_in_fan_out\": false,\n  \"target_modules\": [{}]\n}}\n",
        t.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use frugal_core::model::{Dims, LayerSpec, LossKind, OptimizerSpec, Src};

    #[test]
    fn merge_adds_the_scaled_product_and_adapters_get_peft_names() {
        let spec = ModelSpec {
            input: Dims::flat(3),
            layers: vec![LayerSpec {
                name: "fc".into(),
                kind: LayerKind::LoraLinear {
                    out: 2,
                    bias: false,
                    rank: 1,
                    alpha: 2.0,
                },
                inputs: vec![Src::Input],
                trainable: true,
                update: Default::default(),
            }],
            loss: LossKind::Mse,
            optimizer: OptimizerSpec::Sgd {
                lr: 0.1,
                momentum: 0.0,
                weight_decay: 0.0,
            },
            seed: 0,
        };
        let t: Tensors = vec![
            ("fc.weight".into(), vec![2, 3], vec![1.0; 6]),
            ("fc.lora_A.weight".into(), vec![1, 3], vec![1.0, 2.0, 3.0]),
            ("fc.lora_B.weight".into(), vec![2, 1], vec![0.5, -1.0]),
        ];
        let m = merge(&spec, &t).unwrap();
        assert_eq!(m.len(), 1);
        // W + 2·B·A.
        assert_eq!(m[0].2, vec![2.0, 3.0, 4.0, -1.0, -3.0, -5.0]);
        let a = adapters(&spec, &t).unwrap();
        assert_eq!(a[0].0, "base_model.model.fc.lora_A.weight");
        assert_eq!(a[1].0, "base_model.model.fc.lora_B.weight");
        assert!(merge(&spec, &t[..1].to_vec()).is_err());
    }
}
