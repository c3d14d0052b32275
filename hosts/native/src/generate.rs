//! Sampling text from a trained sequence model: the byte tokenizer ([`crate::text`]), a causal model
//! planned for one sequence, next-token sampling at a temperature from a seeded generator.
use frugal_core::exec::Executor;
use frugal_core::graph::Graph;
use frugal_core::model::ModelSpec;
use frugal_core::plan::Plan;
use frugal_core::rng::Rng;

/// How to sample.
#[derive(Clone, Copy, Debug)]
pub struct Sampling {
    /// Tokens to generate.
    pub length: usize,
    /// Softmax temperature (> 0; 1 samples the model's distribution, lower is greedier).
    pub temperature: f32,
    /// Generator seed: the same seed, model and prompt give the same text.
    pub seed: u64,
}

/// Why text could not be generated.
#[derive(Debug)]
pub struct GenerateError(pub String);

impl std::fmt::Display for GenerateError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for GenerateError {}

/// Index of the sample from `softmax(logits / temperature)` for a uniform `u` in [0, 1).
pub fn sample(logits: &[f32], temperature: f32, u: f32) -> usize {
    let m = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let w: Vec<f64> = logits
        .iter()
        .map(|&z| (((z - m) / temperature) as f64).exp())
        .collect();
    let total: f64 = w.iter().sum();
    let mut acc = 0.0;
    let target = u as f64 * total;
    for (i, &p) in w.iter().enumerate() {
        acc += p;
        if target < acc {
            return i;
        }
    }
    w.len().saturating_sub(1)
}

/// Generates `s.length` bytes after `prompt` with the model `spec` whose weights `load` writes into
/// the executor. The model input is the last `seq` tokens (the prompt right-padded with zeros while it
/// is shorter: causal attention makes position `i` see only tokens up to `i`).
pub fn generate(
    spec: &ModelSpec,
    load: impl FnOnce(&mut Executor<'_>, &mut [u8]) -> Result<(), Box<dyn std::error::Error>>,
    prompt: &[u8],
    s: Sampling,
) -> Result<Vec<u8>, Box<dyn std::error::Error>> {
    if !(s.temperature.is_finite() && s.temperature > 0.0) {
        return Err(
            GenerateError(format!("temperature must be > 0, got {}", s.temperature)).into(),
        );
    }
    let plan = Plan::new(Graph::new(spec, 1)?);
    let seq = spec.input.numel();
    if plan.graph.tokens != seq {
        return Err(GenerateError(
            "generate needs a sequence model: an embedding first, a label per token".into(),
        )
        .into());
    }
    let vocab = plan.graph.pred_dims().numel() / seq;
    let mut arena = vec![0u8; plan.needed_bytes()];
    let mut ex = Executor::new(&plan, &arena)?;
    ex.init_params(&mut arena, spec.seed)?;
    load(&mut ex, &mut arena)?;
    let mut rng = Rng::new(s.seed);
    let mut text: Vec<u8> = if prompt.is_empty() {
        b"\n".to_vec()
    } else {
        prompt.to_vec()
    };
    let start = text.len();
    let mut x = vec![0f32; seq];
    for _ in 0..s.length {
        let ctx = &text[text.len().saturating_sub(seq)..];
        x.iter_mut().for_each(|v| *v = 0.0);
        for (v, &b) in x.iter_mut().zip(ctx) {
            *v = (b as usize).min(vocab - 1) as f32;
        }
        let logits = ex.predict(&mut arena, &x)?;
        let at = ctx.len() - 1;
        let next = sample(
            &logits[at * vocab..(at + 1) * vocab],
            s.temperature,
            rng.uniform(0.0, 1.0),
        );
        text.push(crate::text::decode(next).unwrap_or(b'?'));
    }
    Ok(text[start..].to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampling_follows_the_distribution_and_temperature() {
        let z = [0.0, 2.0, 0.0];
        assert_eq!(sample(&z, 1e-3, 0.999), 1);
        assert_eq!(sample(&z, 1e-3, 0.0), 1);
        assert_eq!(sample(&z, 1.0, 0.0), 0);
        assert_eq!(sample(&z, 1.0, 0.9999), 2);
    }
}
