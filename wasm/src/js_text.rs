//! The sequence-training methods of the JS `Trainer` (the `seq` build, `frugal_wasm_seq.js`): token ids
//! in, losses and suggestions out. Arguments are checked as everywhere in [`crate::js`]: a bad one
//! throws an `ArgumentError`, nothing traps.
use js_sys::{Array, Object};
use wasm_bindgen::prelude::*;

use crate::js::{js_error, set, Trainer};
use crate::session::integer;

#[wasm_bindgen]
impl Trainer {
    /// Adds training windows of a sequence model from `tokens` (ids below `classes`, e.g. the bytes
    /// of the user's text): every `stride` tokens (default a quarter of the sequence length `tokens`,
    /// at most all of it; every token makes batches of near-copies),
    /// the next `tokens` ids, each labelled with the id after it. Returns the windows added.
    #[wasm_bindgen(js_name = addTokens)]
    pub fn add_tokens(&mut self, tokens: &[u32], stride: Option<f64>) -> Result<usize, JsValue> {
        let stride = match stride {
            None => (self.s.tokens() / 4).max(1),
            Some(v) => integer("stride", v, 1, self.s.tokens() as u64).map_err(js_error)? as usize,
        };
        self.s.add_tokens(tokens, stride).map_err(js_error)
    }

    /// The model's mean cross-entropy per token (nats) on `tokens`, cut into consecutive windows;
    /// `Math.exp` of it is the perplexity. Changes nothing.
    #[wasm_bindgen(js_name = evaluateTokens)]
    pub fn evaluate_tokens(&mut self, tokens: &[u32]) -> Result<f64, JsValue> {
        self.s.evaluate_tokens(tokens).map_err(js_error)
    }

    /// The `k` most likely next tokens after `context` (its last `tokens` ids), most likely first:
    /// an array of `{ token, probability }`.
    pub fn suggest(&mut self, context: &[u32], k: f64) -> Result<Array, JsValue> {
        let k = integer("k", k, 1, self.s.classes() as u64).map_err(js_error)? as usize;
        let out = Array::new();
        for (t, p) in self.s.suggest(context, k).map_err(js_error)? {
            let o: JsValue = Object::new().into();
            set(&o, "token", t);
            set(&o, "probability", p);
            out.push(&o);
        }
        Ok(out)
    }

    /// Labels per sample: a sequence model's length (its context, in tokens); 1 for a classifier.
    #[wasm_bindgen(getter)]
    pub fn tokens(&self) -> usize {
        self.s.tokens()
    }
}
