//! The parser's own allocation stays near the size of what it parses (before:
//! a 50M-element u8 metadata array took 32 bytes per element, 1.6 GB).
//!
//! A counting global allocator records the peak bytes live; this binary holds this one
//! test so no other test's allocations are counted.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use gguf::{Gguf, ValueType};

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards every call to the system allocator unchanged; only counts bytes.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let now = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
        PEAK.fetch_max(now, Ordering::Relaxed);
        // SAFETY: same layout contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: `ptr` came from `alloc` above with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Peak bytes allocated by `f` beyond what was live before it.
fn peak_of<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let base = LIVE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let out = f();
    (out, PEAK.load(Ordering::Relaxed) - base)
}

#[test]
fn large_scalar_arrays_cost_about_their_file_size() {
    const N: usize = 4_000_000;
    // Written by hand (GGUF v3: header, two array key/values, no tensors).
    let mut bytes = Vec::with_capacity(64 + 5 * N);
    bytes.extend_from_slice(b"GGUF");
    bytes.extend_from_slice(&3u32.to_le_bytes());
    bytes.extend_from_slice(&0u64.to_le_bytes());
    bytes.extend_from_slice(&2u64.to_le_bytes());
    let array_header = |bytes: &mut Vec<u8>, key: &str, ty: ValueType| {
        bytes.extend_from_slice(&(key.len() as u64).to_le_bytes());
        bytes.extend_from_slice(key.as_bytes());
        bytes.extend_from_slice(&(ValueType::Array as u32).to_le_bytes());
        bytes.extend_from_slice(&(ty as u32).to_le_bytes());
        bytes.extend_from_slice(&(N as u64).to_le_bytes());
    };
    array_header(&mut bytes, "big.u8", ValueType::U8);
    bytes.resize(bytes.len() + N, 7);
    array_header(&mut bytes, "big.i32", ValueType::I32);
    for i in 0..N as i32 {
        bytes.extend_from_slice(&i.to_le_bytes());
    }
    let payload = N + 4 * N;
    assert!(bytes.len() >= payload);

    let (g, peak) = peak_of(|| Gguf::parse(&bytes).unwrap());
    eprintln!(
        "parse of {} bytes: peak {peak} bytes allocated",
        bytes.len()
    );
    // The arrays themselves are `payload` bytes; allow a quarter more for the rest.
    assert!(
        peak <= payload + payload / 4,
        "parsing a {} byte file allocated {peak} bytes at peak ({:.1}x its arrays)",
        bytes.len(),
        peak as f64 / payload as f64
    );
    assert_eq!(g.get_u32_array("big.u8").unwrap().len(), N);
    let i = g.get_i32_array("big.i32").unwrap();
    assert_eq!((i[0], i[N - 1]), (0, N as i32 - 1));
}
