//! The board table: memory maps, budgets and the training run of each board. One source for `build.rs`
//! (planning, `memory.x`), the firmware and `cargo xtask firmware` (which include this file by path).

/// The numbers a firmware build trains in (the `int8` cargo feature picks int8).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Numerics {
    /// f32 everywhere.
    F32,
    /// int8 weights, activations and errors, int32 accumulation (see `frugal_core::quant`).
    Int8,
}

impl Numerics {
    /// Name (the `--precision` argument).
    pub fn name(self) -> &'static str {
        match self {
            Numerics::F32 => "f32",
            Numerics::Int8 => "int8",
        }
    }
}

/// Where the frozen parameters of an f32 plan live (see `frugal_core::plan::params`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Frozen {
    /// In the arena, with everything else.
    Arena,
    /// In a read-only parameter image in flash, f32.
    FlashF32,
    /// In a read-only parameter image in flash, Linear/Conv weights int8 with per-output-channel
    /// scales (quantised on the host at build time), dequantised on the fly.
    FlashInt8,
}

/// One board and the run the firmware does on it.
#[derive(Clone, Copy, Debug)]
pub struct Board {
    /// Name (the cargo feature and the `--board` argument).
    pub name: &'static str,
    /// Rust target triple.
    pub target: &'static str,
    /// `qemu-system-arm -machine`.
    pub qemu_machine: &'static str,
    /// `qemu-system-arm -cpu`.
    pub qemu_cpu: &'static str,
    /// Binary model (`FRGM`), relative to the repository root.
    pub model: &'static str,
    /// Samples per training step.
    pub batch: usize,
    /// The precisions the board runs, the first being the default of a single build.
    pub numerics: &'static [Numerics],
    /// The int8 weight update: 0 for f32 master weights, else the integer update's `update_bits`.
    pub int8_update_bits: u8,
    /// Most i32 elements an int8 Linear weight gradient accumulates at once (0: the whole gradient;
    /// see `frugal_core::graph::GraphOptions::grad_tile`).
    pub int8_grad_tile: usize,
    /// The budget in f32: bytes of the static arena the plan must fit.
    pub arena: usize,
    /// The budget in int8.
    pub arena_int8: usize,
    /// Bytes of the static heap used at boot (plan decoding) in f32.
    pub heap: usize,
    /// Bytes of the static heap in int8.
    pub heap_int8: usize,
    /// Training samples compiled into flash (the first of the bundled training split).
    pub n_train: usize,
    /// Held-out samples compiled into flash (the first of the bundled test split).
    pub n_test: usize,
    /// Passes over the training slice.
    pub epochs: usize,
    /// Held-out accuracy (percent) the run must reach to exit with status 0.
    pub threshold_pct: usize,
    /// Most RAM the run may use: statics (arena, heap, buffers) + the stack's high-water mark.
    pub ram_limit: usize,
    /// Flash origin and length.
    pub flash: (u32, u32),
    /// RAM origin and length.
    pub ram: (u32, u32),
    /// Core clock QEMU gives SysTick (Hz): with `-icount shift=0` one instruction is 1 ns.
    pub sysclk_hz: u64,
    /// Weight-initialisation seed.
    pub seed: u64,
    /// `opt-level` of the release build (`z` where flash is short).
    pub opt_level: &'static str,
    /// Pretrained persistent tensors (`FRGW`, written by `cargo xtask mcu-pretrain`), relative to the
    /// repository root, loaded over the seeded initialisation at boot; None: train from scratch.
    pub weights: Option<&'static str>,
    /// The digits the run trains and evaluates on: `(lo, n)` keeps labels `lo..lo + n`, relabelled
    /// `0..n` (the training and held-out counts are of the kept samples).
    pub classes: (u8, u8),
    /// Each 8×8 digit is upscaled by this factor (nearest) into the model's input.
    pub upscale: usize,
    /// Where the frozen parameters live (f32 builds).
    pub frozen: Frozen,
}

/// Netduino Plus 2 (STM32F405, Cortex-M4F): 1 MiB flash, 128 KiB RAM.
pub const NETDUINOPLUS2: Board = Board {
    name: "netduinoplus2",
    target: "thumbv7em-none-eabihf",
    qemu_machine: "netduinoplus2",
    qemu_cpu: "cortex-m4",
    model: "examples/digits-cnn.frgm",
    batch: 4,
    numerics: &[Numerics::F32, Numerics::Int8],
    int8_update_bits: 0,
    int8_grad_tile: 0,
    arena: 64 * 1024,
    arena_int8: 40 * 1024,
    heap: 16 * 1024,
    heap_int8: 24 * 1024,
    n_train: 1437,
    n_test: 360,
    epochs: 2,
    threshold_pct: 85,
    ram_limit: 96 * 1024,
    flash: (0x0800_0000, 1024 * 1024),
    ram: (0x2000_0000, 128 * 1024),
    sysclk_hz: 168_000_000,
    seed: 1,
    opt_level: "3",
    weights: None,
    classes: (0, 10),
    upscale: 1,
    frozen: Frozen::Arena,
};

/// BBC micro:bit v1 (nRF51822, Cortex-M0, no FPU): 256 KiB flash, 16 KiB RAM. Runs int8 only (f32 and
/// the f32 executor do not fit the flash and RAM together).
///
/// The model is an MLP whose first layer is a Linear (the int8 executor quantises the input there):
/// 64→16→10, pure-integer update with `update_bits` 2. Its plan is sized for the board: GEMM scratch
/// for the portable kernel, and `fc1`'s weight gradient accumulated 4 rows (256 i32) at a time instead
/// of whole (the whole i32 gradient alone was 4,160 B of the former 7,808 B arena). Measured
/// (`cargo xtask firmware --board microbit`): arena 4,288 B; heap peak 4,194 B while decoding the plan
/// without names, 3,292 B held afterwards (plan and executor state), then the executor itself; stack
/// high-water 3,836 B (the executor on the heap instead of the training frame: −280 B); RAM in all
/// 12,920 B of the 14 KiB limit; 88 % held-out after 10 epochs; 1.10 M instructions per step; the
/// first 10 losses equal the native run's bit for bit.
pub const MICROBIT: Board = Board {
    name: "microbit",
    target: "thumbv6m-none-eabi",
    qemu_machine: "microbit",
    qemu_cpu: "cortex-m0",
    model: "firmware/models/microbit-mlp.frgm",
    batch: 4,
    numerics: &[Numerics::Int8],
    int8_update_bits: 2,
    int8_grad_tile: 256,
    arena: 6 * 1024,
    arena_int8: 4352,
    heap: 8 * 1024,
    // Decoding peaks at 4,178 B (counted; the allocator rounds each block up to 8 bytes).
    heap_int8: 4608,
    n_train: 1000,
    n_test: 360,
    epochs: 10,
    threshold_pct: 85,
    ram_limit: 14 * 1024,
    flash: (0x0000_0000, 256 * 1024),
    ram: (0x2000_0000, 16 * 1024),
    sysclk_hz: 16_000_000,
    seed: 1,
    opt_level: "z",
    weights: None,
    classes: (0, 10),
    upscale: 1,
    frozen: Frozen::Arena,
};

/// ARM MPS2 with the AN500 FPGA image (Cortex-M7 with FPU): 4 MiB of SSRAM at 0 stand in for flash,
/// RAM cut to 256 KiB by the linker script (tiny-training's SRAM). Transfer learning: the
/// MobileNetV2-class `examples/mcu-mbv2.toml` pretrained on digits 0–4 by `cargo xtask mcu-pretrain`,
/// fine-tuned on digits 5–9 (16×16, upscaled on the device from the 8×8 digits in flash) with the
/// sparse update the selection policy picked (`firmware/models/mcu-mbv2-ft.frgm`). f32 training; the
/// frozen parameters stay in flash, in a read-only parameter image with int8 weights (`frozen`), and
/// only the trained ones are copied into the arena at boot.
///
/// Measured (`cargo xtask firmware --board mps2-an500`): arena 86,336 B (131,008 B when the frozen
/// parameters were copied into it); heap peak 41,263 B while decoding; stack high-water 7,932 B; RAM
/// in all 144,188 B (188,216 B before); 95 % held-out on digits 5–9 after 3 epochs; 7.52 M
/// instructions per step (7.29 M before: the dequantisation).
pub const MPS2_AN500: Board = Board {
    name: "mps2-an500",
    target: "thumbv7em-none-eabihf",
    qemu_machine: "mps2-an500",
    qemu_cpu: "cortex-m7",
    model: "firmware/models/mcu-mbv2-ft.frgm",
    batch: 4,
    numerics: &[Numerics::F32],
    int8_update_bits: 0,
    int8_grad_tile: 0,
    arena: 85 * 1024,
    arena_int8: 160 * 1024,
    heap: 48 * 1024,
    heap_int8: 48 * 1024,
    n_train: 700,
    n_test: 170,
    epochs: 3,
    threshold_pct: 85,
    // tiny-training's 256 KiB is the linker's RAM; the run must stay within the goal beyond it.
    ram_limit: 192 * 1024,
    flash: (0x0000_0000, 4 * 1024 * 1024),
    ram: (0x2000_0000, 256 * 1024),
    sysclk_hz: 25_000_000,
    seed: 1,
    opt_level: "3",
    weights: Some("firmware/models/mcu-mbv2-pretrained.frgw"),
    classes: (5, 5),
    upscale: 2,
    frozen: Frozen::FlashInt8,
};

impl Board {
    /// Elements of one input sample (the 8×8 digit upscaled by `upscale`).
    pub const fn input_len(&self) -> usize {
        64 * self.upscale * self.upscale
    }
    /// The budget (static arena bytes) in `n`.
    pub const fn arena_for(&self, n: Numerics) -> usize {
        match n {
            Numerics::F32 => self.arena,
            Numerics::Int8 => self.arena_int8,
        }
    }
    /// The boot heap bytes in `n`.
    pub const fn heap_for(&self, n: Numerics) -> usize {
        match n {
            Numerics::F32 => self.heap,
            Numerics::Int8 => self.heap_int8,
        }
    }
}

/// Every board.
#[allow(dead_code)]
pub const ALL: [Board; 3] = [NETDUINOPLUS2, MICROBIT, MPS2_AN500];
