//! Board and runtime glue — the only module with `unsafe`: the static arena, the boot heap wrapped in a
//! counting allocator, the SysTick clock, the stack paint, the semihosting exit, the panic and the
//! hard-fault handlers.
#![allow(unsafe_code)]

use core::alloc::{GlobalAlloc, Layout};
use core::cell::Cell;
use core::mem::MaybeUninit;
use core::ptr::{addr_of, addr_of_mut};
use core::sync::atomic::{AtomicBool, AtomicU32, Ordering::Relaxed};

use cortex_m::peripheral::{syst::SystClkSource, SYST};
use cortex_m_rt::exception;
use critical_section::Mutex;
use embedded_alloc::LlffHeap;

use crate::{ARENA, BOARD, HEAP};

/// What the heap has seen since boot.
#[derive(Clone, Copy, Default)]
pub struct HeapStats {
    /// Successful allocations (and reallocations).
    pub allocs: u32,
    /// Bytes allocated now.
    pub in_use: usize,
    /// Most bytes allocated at once.
    pub peak: usize,
}

/// The boot heap with counters: a training step must leave `allocs` unchanged.
struct Counting {
    heap: LlffHeap,
    stats: Mutex<Cell<HeapStats>>,
}

impl Counting {
    fn note(&self, grow: usize, shrink: usize) {
        critical_section::with(|cs| {
            let c = self.stats.borrow(cs);
            let mut s = c.get();
            s.allocs += 1;
            s.in_use = s.in_use + grow - shrink;
            s.peak = s.peak.max(s.in_use);
            c.set(s);
        });
    }
}

// SAFETY: every call forwards to `LlffHeap`, a correct allocator for the region given to `init`; the
// counters are updated inside a critical section and never touch the returned memory.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract, which we pass on unchanged.
        let p = unsafe { self.heap.alloc(layout) };
        if p.is_null() {
            // Say so before the allocation-failure abort, which may have no room left to.
            let s = heap();
            defmt::error!(
                "heap exhausted: {=usize} B requested with {=usize} of {=usize} B in use",
                layout.size(),
                s.in_use,
                HEAP
            );
        } else {
            self.note(layout.size(), 0);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was returned by `alloc` with this `layout` (the caller's contract).
        unsafe { self.heap.dealloc(ptr, layout) };
        critical_section::with(|cs| {
            let c = self.stats.borrow(cs);
            let mut s = c.get();
            s.in_use -= layout.size();
            c.set(s);
        });
    }
}

#[global_allocator]
static ALLOC: Counting = Counting {
    heap: LlffHeap::empty(),
    stats: Mutex::new(Cell::new(HeapStats {
        allocs: 0,
        in_use: 0,
        peak: 0,
    })),
};

/// Heap counters now.
pub fn heap() -> HeapStats {
    critical_section::with(|cs| ALLOC.stats.borrow(cs).get())
}

/// The budget: a static arena of exactly `ARENA` bytes.
#[repr(C, align(64))]
struct Arena([u8; ARENA]);

static TAKEN: AtomicBool = AtomicBool::new(false);

/// The arena, once (a second call is a bug and panics).
pub fn arena() -> &'static mut [u8] {
    static mut ARENA_MEM: Arena = Arena([0; ARENA]);
    critical_section::with(|_| {
        assert!(!TAKEN.load(Relaxed), "the arena is taken once");
        TAKEN.store(true, Relaxed);
    });
    // SAFETY: `TAKEN` guarantees this is the only reference ever made to `ARENA_MEM`.
    unsafe { &mut (*addr_of_mut!(ARENA_MEM)).0 }
}

const PAINT: u32 = 0x5EED_F00D;

extern "C" {
    /// End of the statics (.data, .bss, .uninit): cortex-m-rt's heap start symbol.
    static __sheap: u32;
    /// Top of the stack (cortex-m-rt).
    static _stack_start: u32;
}

fn statics_end() -> usize {
    // Only the address of the linker symbol is taken, never its value.
    addr_of!(__sheap) as usize
}

fn stack_top() -> usize {
    addr_of!(_stack_start) as usize
}

/// Bytes of RAM the statics take (arena, heap, buffers, .data): from the linker's symbols.
pub fn statics_bytes() -> usize {
    statics_end() - BOARD.ram.0 as usize
}

/// Paints the free stack below the current frame, for [`stack_used`].
fn paint_stack() {
    let sp = cortex_m::register::msp::read() as usize;
    let mut p = (statics_end() + 3) & !3;
    let end = sp.saturating_sub(256);
    while p < end {
        // SAFETY: [statics end, sp - 256) is RAM that nothing uses yet (the stack grows down to it later).
        unsafe { (p as *mut u32).write_volatile(PAINT) };
        p += 4;
    }
}

/// The stack's high-water mark in bytes: from the top down to the lowest word no longer painted.
pub fn stack_used() -> usize {
    let mut p = (statics_end() + 3) & !3;
    let top = stack_top();
    // SAFETY: reads of RAM between the statics and the stack top, all word-aligned and mapped.
    while p < top && unsafe { (p as *const u32).read_volatile() } == PAINT {
        p += 4;
    }
    top - p
}

static WRAPS: AtomicU32 = AtomicU32::new(0);

#[exception]
fn SysTick() {
    // Only this handler writes WRAPS (no read-modify-write atomics on the Cortex-M0).
    WRAPS.store(WRAPS.load(Relaxed).wrapping_add(1), Relaxed);
}

/// SysTick ticks at the core clock since boot (24-bit counter extended by its wrap interrupt).
pub fn ticks() -> u64 {
    loop {
        let w = WRAPS.load(Relaxed);
        let cur = SYST::get_current();
        if WRAPS.load(Relaxed) == w {
            return ((w as u64) << 24) | (0x00FF_FFFF - cur) as u64;
        }
    }
}

/// Boot: paint the stack, give the heap its static region, start the clock.
pub fn init() {
    paint_stack();
    static mut HEAP_MEM: [MaybeUninit<u8>; HEAP] = [MaybeUninit::uninit(); HEAP];
    // SAFETY: called once at boot, before any allocation; the region is a static used by nothing else.
    unsafe { ALLOC.heap.init(addr_of_mut!(HEAP_MEM) as usize, HEAP) };
    if let Some(mut p) = cortex_m::Peripherals::take() {
        p.SYST.set_clock_source(SystClkSource::Core);
        p.SYST.set_reload(0x00FF_FFFF);
        p.SYST.clear_current();
        p.SYST.enable_interrupt();
        p.SYST.enable_counter();
    }
}

/// Ends the QEMU run with status 0 (`ok`) or 1.
pub fn exit(ok: bool) -> ! {
    use cortex_m_semihosting::debug;
    debug::exit(if ok {
        debug::EXIT_SUCCESS
    } else {
        debug::EXIT_FAILURE
    });
    loop {
        cortex_m::asm::bkpt();
    }
}

/// A fault (on these boards: the stack running into the statics, or an access outside RAM) ends the
/// run with failure instead of spinning until the host's timeout.
#[exception]
unsafe fn HardFault(_frame: &cortex_m_rt::ExceptionFrame) -> ! {
    defmt::error!(
        "hard fault (stack high-water {=usize} B; the stack may have overrun the statics)",
        stack_used()
    );
    exit(false)
}

#[panic_handler]
fn panic(info: &core::panic::PanicInfo) -> ! {
    defmt::error!("panic: {}", defmt::Display2Format(info));
    exit(false)
}
