//! Frames: many data records under one ring record header (the layout is drawn in
//! [`crate::layout`]).
//!
//! Why: with one header per record, a reader finds record i + 1 only after it has loaded
//! record i's header — a chain of dependent loads, one per record — and an 8-byte record
//! moves 16 bytes. A frame is checked once, from a local copy of its header, and its records
//! are then addressed from a loop index: `start + i × stride` for fixed-size records, or
//! through a table of end offsets (checked in one pass) for records of any size.
//!
//! The writer keeps one frame open per ring ([`crate::Producer::append`]) and closes it when
//! it publishes, when the frame is full, or before any other record (a barrier, a
//! watermark, end of stream), so the order of records and control records is kept.

use crate::layout::{FRAME_HEADER_BYTES, FRAME_START_MAX};
use crate::region::RegionBase;

/// How a frame lays out its records; the writer says which on each append.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stride {
    /// Every record of the frame has the same length (a fixed-layout record type): record
    /// i sits at `start + i × stride`, and a reader may view the records as one array.
    Fixed,
    /// Records of any length, found through the frame's table of end offsets.
    Variable,
}

/// Payload bytes a writer fills before it closes a frame and opens the next (one record
/// more if that record alone is longer). Big enough that the header costs nothing per
/// record (512 records of 8 bytes), small enough that a frame is a few pages of a ring.
pub(crate) const FRAME_MAX_BYTES: usize = 4096;

/// Records a variable frame holds at most (the writer keeps their end offsets until the
/// frame closes).
pub(crate) const VARIABLE_MAX_RECORDS: usize = 512;

/// Where a frame's first record starts, from the start of its payload at byte `payload_at`
/// of the slot area (which starts 128-aligned): after the header, on a boundary of the
/// largest power of two, at most 64, that divides the stride (8 for variable frames), so a
/// record never straddles a cache line it need not straddle.
#[inline]
pub(crate) fn start_for(payload_at: usize, stride: Option<usize>) -> usize {
    let align = match stride {
        Some(s) if s > 0 => 1usize << (s.trailing_zeros().min(6)),
        _ => 8,
    }
    .max(8);
    let first = payload_at + FRAME_HEADER_BYTES;
    let start = first.next_multiple_of(align) - payload_at;
    debug_assert!(start <= FRAME_START_MAX);
    start
}

/// A frame being read: its checked shape, copied out of shared memory, and how far the
/// reader got. A reader never looks at the frame header again, so a peer that rewrites it
/// meanwhile changes nothing.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Cursor {
    /// Records not yet handed out; 0: no frame is being read.
    pub left: u32,
    /// A fixed frame's stride; 0 for a variable frame.
    pub stride: u32,
    /// Byte offset, in the slot area, of the next record's first byte.
    pub next: usize,
    /// Variable: byte offset, in the slot area, of the next record's end offset.
    pub table: usize,
    /// Variable: byte offset, in the slot area, of the first data byte (end offsets count
    /// from here).
    pub data: usize,
    /// Variable: byte offset, in the slot area, one past the last data byte.
    pub data_end: usize,
    /// Largest record.
    pub max_record_bytes: u32,
    /// Slots the whole frame takes: the read position moves by this once the last record
    /// is released.
    pub slots: u64,
}

/// Load 4 bytes at byte `at` of the slot area, once (a peer may write them meanwhile).
#[inline(always)]
fn load_u32(base: RegionBase, at: usize) -> u32 {
    // SAFETY: the caller passes an offset inside a published, unreleased frame (checked
    // against the frame's length), which lies inside the slot area; `[u8; 4]` has alignment
    // 1, so any offset is aligned. Volatile: one load, so the checked value is the used one.
    u32::from_le_bytes(unsafe { (base.area_ptr(at) as *const [u8; 4]).read_volatile() })
}

/// Check the frame whose payload of `len` bytes starts at byte `payload_at` of the slot
/// area and return a cursor at its first record; `Err(word)` (the header word, for the
/// poison detail) if the header or the table does not describe the bytes. The caller has
/// checked that the payload lies inside what was published and inside the ring.
///
/// Inlined into its one caller, so the cursor is written straight into the consumer: as a
/// call, its result came back through the stack in stores that the 16-byte loads copying it
/// could not be forwarded from, and each frame's opening waited for the stores before it
/// — the consumer's release of the previous frame, whose line the producer polls — to
/// reach the cache.
#[inline(always)]
pub(crate) fn open(
    base: RegionBase,
    payload_at: usize,
    len: usize,
    slots: u64,
    max_record_bytes: u32,
) -> Result<Cursor, u64> {
    if len < FRAME_HEADER_BYTES {
        return Err(0);
    }
    // SAFETY: `payload_at` is 8 past a slot boundary (slots are >= 8 bytes and the area is
    // 128-aligned), so 8-aligned, and the payload has at least 8 bytes (checked above).
    // Volatile: one load; everything below uses this copy.
    let word = u64::from_le(unsafe { (base.area_ptr(payload_at) as *const u64).read_volatile() });
    let count = word as u32;
    let stride = (word >> 32) as u16 as u32;
    let start = (word >> 48) as usize;
    let bad = Err(word);
    if count == 0 || !(FRAME_HEADER_BYTES..=FRAME_START_MAX).contains(&start) || !start.is_multiple_of(8) || start > len
    {
        return bad;
    }
    let mut cursor = Cursor {
        left: count,
        stride,
        next: payload_at + start,
        table: 0,
        data: payload_at + start,
        data_end: 0,
        max_record_bytes,
        slots,
    };
    if stride != 0 {
        // u64: count < 2^32 and stride < 2^16, so the product cannot overflow.
        if stride > max_record_bytes || start as u64 + count as u64 * stride as u64 != len as u64 {
            return bad;
        }
        return Ok(cursor);
    }
    // Variable: the table is the last 4 × count bytes, the data lies between start and it.
    let table_bytes = count as u64 * 4;
    if table_bytes > (len - start) as u64 {
        return bad;
    }
    let table = payload_at + len - table_bytes as usize;
    let data_len = table - cursor.data;
    // One pass over the table: non-decreasing ends, each record within the max, the last
    // end exactly where the table begins.
    let mut prev = 0usize;
    for i in 0..count as usize {
        let end = load_u32(base, table + 4 * i) as usize;
        if end < prev || end > data_len || end - prev > max_record_bytes as usize {
            return bad;
        }
        prev = end;
    }
    if prev != data_len {
        return bad;
    }
    cursor.table = table;
    cursor.data_end = table;
    Ok(cursor)
}

impl Cursor {
    /// The next record: its first byte's offset in the slot area and its length. `None`
    /// only if a variable frame's table changed since it was checked (a peer wrote into
    /// a published frame): the caller poisons the ring.
    #[inline(always)]
    pub(crate) fn peek(&self, base: RegionBase) -> Option<(usize, usize)> {
        debug_assert!(self.left > 0);
        if self.stride != 0 {
            return Some((self.next, self.stride as usize));
        }
        self.peek_variable(base)
    }

    /// `peek` for a variable frame (out of line: the fixed case is the one kept short).
    #[inline(never)]
    fn peek_variable(&self, base: RegionBase) -> Option<(usize, usize)> {
        // Checked again as it is used: the pass in `open` read other loads of these bytes.
        let end = self.data + load_u32(base, self.table) as usize;
        if end < self.next || end > self.data_end || end - self.next > self.max_record_bytes as usize {
            return None;
        }
        Some((self.next, end - self.next))
    }

    /// The next `n` records of a fixed frame were released, ending at `end`. True when the
    /// last of them was the frame's last.
    #[inline(always)]
    pub(crate) fn step_run(&mut self, n: u32, end: usize) -> bool {
        debug_assert!(self.stride != 0 && n <= self.left);
        self.next = end;
        self.left -= n;
        self.left == 0
    }

    /// The record `peek` returned was released; `end` is its end offset. True when it was
    /// the frame's last.
    #[inline(always)]
    pub(crate) fn step(&mut self, end: usize) -> bool {
        self.next = end;
        self.table += 4;
        self.left -= 1;
        self.left == 0
    }
}
