//! The memory a ring lives in: a file mapping (other processes can attach), an anonymous
//! mapping (in-process channels), or the heap (tests; the only backing under loom).
//!
//! A [`Region`] owns the memory and the layout numbers, read once at creation or attach
//! and validated then; they are never re-read from shared memory, so a peer that
//! scribbles over the header cannot change them under us.

use crate::error::ConfigError;
#[cfg(not(loom))]
use crate::error::{AttachError, CreateError};
use crate::layout::{HEADER_BYTES, MAGIC, RECORD_HEADER_BYTES, RingHeader, VERSION};
use crate::process;
use crate::sync::Ordering;
use std::path::Path;
#[cfg(not(loom))]
use std::path::PathBuf;

/// The shape of a ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingConfig {
    /// Bytes per slot: a power of two, at least 8. Records take whole slots.
    pub slot_bytes: u32,
    /// Number of slots: a power of two, at least 2. The credit a fresh ring grants.
    pub slot_count: u32,
    /// Largest payload a record may carry; larger claims are refused, never truncated.
    pub max_record_bytes: u32,
}

impl Default for RingConfig {
    /// 4096 slots of 64 bytes (256 KiB), records up to 64 KiB.
    fn default() -> Self {
        RingConfig { slot_bytes: 64, slot_count: 4096, max_record_bytes: 64 * 1024 }
    }
}

/// Largest slot area this build maps.
const MAX_RING_BYTES: u64 = 1 << 30;

impl RingConfig {
    /// Check the numbers; the error says what to change.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.slot_bytes < 8 || !self.slot_bytes.is_power_of_two() {
            return Err(ConfigError::SlotBytes(self.slot_bytes));
        }
        if self.slot_count < 2 || !self.slot_count.is_power_of_two() {
            return Err(ConfigError::SlotCount(self.slot_count));
        }
        let ring_bytes = self.ring_bytes();
        if ring_bytes > MAX_RING_BYTES {
            return Err(ConfigError::TooLarge { slot_bytes: self.slot_bytes, slot_count: self.slot_count });
        }
        if self.max_record_bytes as u64 + RECORD_HEADER_BYTES as u64 > ring_bytes {
            return Err(ConfigError::MaxRecord { max_record_bytes: self.max_record_bytes, ring_bytes });
        }
        Ok(())
    }

    /// Bytes of slots.
    pub fn ring_bytes(&self) -> u64 {
        self.slot_bytes as u64 * self.slot_count as u64
    }

    /// Bytes of the whole region: header and slots.
    pub fn region_bytes(&self) -> u64 {
        HEADER_BYTES as u64 + self.ring_bytes()
    }
}

enum Backing {
    #[cfg(not(loom))]
    File { _map: memmap2::MmapMut, path: PathBuf },
    /// Sealed shared memory (a memfd that cannot shrink or grow) reachable at `path` through
    /// a link to `/proc/<pid>/fd/<n>`, which works while `_memfd` is open.
    #[cfg(not(loom))]
    Sealed { _map: memmap2::MmapMut, _memfd: std::fs::File, path: PathBuf },
    #[cfg(not(loom))]
    Anon { _map: memmap2::MmapMut },
    #[cfg(not(loom))]
    Heap { ptr: *mut u8, layout: std::alloc::Layout },
    #[cfg(loom)]
    Loom { _header: Box<RingHeader>, _slots: Box<[std::cell::UnsafeCell<u64>]> },
}

/// A region's two base addresses, header and slot area, copied into a role handle so that
/// its hot paths reach shared memory without a dependent load through the `Arc`: they touch
/// only the handle itself, the header's lines and the slots. Valid while the handle's
/// `Arc<Region>` keeps the region alive; a handle holds both, so it is.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RegionBase {
    header: *const RingHeader,
    slots: *mut u8,
    /// Slots in the area (for the debug check of an index).
    count: u64,
    /// Bytes in the area (for the debug check of an offset).
    bytes: usize,
    /// Under loom: the slots' commit words (see `commit_word`).
    #[cfg(loom)]
    commits: *const crate::sync::AtomicU64,
}

// SAFETY: a RegionBase is only addresses into a Region, which is Send and Sync (see there);
// what may be done through them is governed, as for the Region, by the ring's positions.
unsafe impl Send for RegionBase {}
// SAFETY: as above.
unsafe impl Sync for RegionBase {}

impl RegionBase {
    /// The header.
    #[inline(always)]
    pub(crate) fn header(&self) -> &RingHeader {
        // SAFETY: as `Region::header`: the Region this was taken from is alive (the same
        // handle keeps it), and the pointer is its header.
        unsafe { &*self.header }
    }

    /// Pointer to the first byte of slot `index` (`index < slot_count`), slots of
    /// `1 << shift` bytes.
    #[inline(always)]
    pub(crate) fn slot_ptr(self, index: u64, shift: u32) -> *mut u8 {
        debug_assert!(index < self.count);
        // SAFETY: index < slot_count, so the offset stays inside the slot area, which the
        // Region that this base was taken from (kept alive by the same handle) owns.
        unsafe { self.slots.add((index << shift) as usize) }
    }

    /// The commit word of slot `index` (`index < slot_count`): its first 8 bytes, where a
    /// record header goes (see the layout docs). Every access to a header word goes through
    /// here, as an atomic: the consumer polls it while the producer may store it. Under loom
    /// the word lives beside the slot bytes, in a loom atomic, so the model checker sees the
    /// commit protocol.
    #[inline(always)]
    pub(crate) fn commit_word<'a>(self, index: u64, shift: u32) -> &'a crate::sync::AtomicU64 {
        #[cfg(not(loom))]
        {
            // SAFETY: `slot_ptr` is slot `index`'s first byte, 8-aligned (slot_bytes is a
            // power of two >= 8, the area starts 128-aligned); AtomicU64 has the size and
            // alignment of u64, and shared memory may be read and written as one by either
            // side. The Region outlives the handle holding this base; callers use the
            // reference at once.
            unsafe { &*(self.slot_ptr(index, shift) as *const crate::sync::AtomicU64) }
        }
        #[cfg(loom)]
        {
            let _ = shift;
            debug_assert!(index < self.count);
            // SAFETY: `commits` holds slot_count atomics owned by the Region (see above).
            unsafe { &*self.commits.add(index as usize) }
        }
    }

    /// Pointer to byte `offset` of the slot area (`offset <= slot_count × slot_bytes`: one
    /// past the end only for an empty slice).
    #[inline(always)]
    pub(crate) fn area_ptr(self, offset: usize) -> *mut u8 {
        debug_assert!(offset <= self.bytes);
        // SAFETY: offset <= the area's bytes, so the pointer stays inside the slot area (or
        // one past it, for an empty slice), which the Region that this base was taken from (kept alive by the same handle) owns.
        unsafe { self.slots.add(offset) }
    }
}

/// A mapped ring: header, slots, and the validated layout numbers.
pub(crate) struct Region {
    header: *const RingHeader,
    slots: *mut u8,
    pub(crate) slot_count: u64,
    pub(crate) slot_shift: u32,
    pub(crate) max_record_bytes: u32,
    backing: Backing,
    /// Under loom: one cell per slot, touched on every slot write and read, so loom
    /// checks that the protocol orders them (a missing Release/Acquire shows as a race).
    #[cfg(loom)]
    shadow: Box<[loom::cell::UnsafeCell<()>]>,
    /// Under loom: each slot's commit word (its header word in real memory).
    #[cfg(loom)]
    commits: Box<[crate::sync::AtomicU64]>,
}

// SAFETY: the header is all atomics; slot bytes are only touched by the one producer
// (between claim and publish) and the one consumer (between refresh of tail and release),
// which the positions keep apart. The backing memory is owned by the Region and freed on drop.
unsafe impl Send for Region {}
// SAFETY: as above; `&Region` hands out only the header (atomics) and raw slot pointers
// whose use is governed by the positions.
unsafe impl Sync for Region {}

impl std::fmt::Debug for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Region")
            .field("path", &self.path())
            .field("slot_count", &self.slot_count)
            .field("slot_bytes", &(1u64 << self.slot_shift))
            .field("max_record_bytes", &self.max_record_bytes)
            .finish()
    }
}

impl Region {
    /// The header.
    #[inline]
    pub(crate) fn header(&self) -> &RingHeader {
        // SAFETY: `header` points at the start of memory this Region owns, aligned to at
        // least 128 (page for mappings, 128 for the heap), for as long as `self` lives.
        unsafe { &*self.header }
    }

    /// The base addresses, for a handle to keep next to its positions.
    #[inline]
    pub(crate) fn base(&self) -> RegionBase {
        RegionBase {
            header: self.header,
            slots: self.slots,
            count: self.slot_count,
            bytes: (self.slot_count << self.slot_shift) as usize,
            #[cfg(loom)]
            commits: self.commits.as_ptr(),
        }
    }

    /// Bytes per slot.
    #[inline]
    pub(crate) fn slot_bytes(&self) -> u64 {
        1u64 << self.slot_shift
    }

    /// The file behind the ring, if any.
    pub(crate) fn path(&self) -> Option<&Path> {
        match &self.backing {
            #[cfg(not(loom))]
            Backing::File { path, .. } | Backing::Sealed { path, .. } => Some(path),
            _ => None,
        }
    }

    /// Loom: note a write to slots `[index, index + count)`.
    #[inline]
    pub(crate) fn track_write(&self, _index: u64, _count: u64) {
        #[cfg(loom)]
        for i in _index.._index + _count {
            self.shadow[i as usize].with_mut(|_| ());
        }
    }

    /// Loom: note a read of slots `[index, index + count)`.
    #[inline]
    pub(crate) fn track_read(&self, _index: u64, _count: u64) {
        #[cfg(loom)]
        for i in _index.._index + _count {
            self.shadow[i as usize].with(|_| ());
        }
    }

    fn from_parts(header: *const RingHeader, slots: *mut u8, config: &RingConfig, backing: Backing) -> Region {
        Region {
            header,
            slots,
            slot_count: config.slot_count as u64,
            slot_shift: config.slot_bytes.trailing_zeros(),
            max_record_bytes: config.max_record_bytes,
            backing,
            #[cfg(loom)]
            shadow: (0..config.slot_count).map(|_| loom::cell::UnsafeCell::new(())).collect(),
            #[cfg(loom)]
            commits: (0..config.slot_count).map(|_| crate::sync::AtomicU64::new(0)).collect(),
        }
    }

    /// Whether the header's fixed fields (magic, version, header, slot and max record sizes)
    /// still say what they said when the ring was made or attached: `Err` with the magic as
    /// found when someone wrote over them. A few relaxed loads: for cold paths (a close, a
    /// wait), not per record.
    pub(crate) fn header_intact(&self) -> Result<(), u64> {
        let h = self.header();
        let magic = h.magic.load(Ordering::Relaxed);
        let intact = magic == MAGIC
            && h.version.load(Ordering::Relaxed) == VERSION
            && h.header_bytes.load(Ordering::Relaxed) == HEADER_BYTES
            && h.slot_count.load(Ordering::Relaxed) as u64 == self.slot_count
            && h.slot_bytes.load(Ordering::Relaxed) == 1u32 << self.slot_shift
            && h.max_record_bytes.load(Ordering::Relaxed) == self.max_record_bytes;
        if intact { Ok(()) } else { Err(magic) }
    }

    /// Write a fresh header for `config`; the magic goes last, with Release, so an
    /// attacher that sees it (Acquire) sees every other field.
    fn init_header(&self, config: &RingConfig) {
        let h = self.header();
        h.version.store(VERSION, Ordering::Relaxed);
        h.header_bytes.store(HEADER_BYTES, Ordering::Relaxed);
        h.slot_bytes.store(config.slot_bytes, Ordering::Relaxed);
        h.slot_count.store(config.slot_count, Ordering::Relaxed);
        h.max_record_bytes.store(config.max_record_bytes, Ordering::Relaxed);
        let pid = process::pid();
        h.creator_pid.store(pid, Ordering::Relaxed);
        h.creator_start_ticks.store(process::start_ticks(pid).unwrap_or(0), Ordering::Relaxed);
        // SYNC POINT Release: pairs with the Acquire load of `magic` in `Region::attach`.
        h.magic.store(MAGIC, Ordering::Release);
    }

    /// A ring on the heap. The only backing under loom; otherwise for tests.
    #[cfg(not(loom))]
    pub(crate) fn heap(config: &RingConfig) -> Result<Region, ConfigError> {
        config.validate()?;
        let layout = std::alloc::Layout::from_size_align(config.region_bytes() as usize, 128)
            .expect("validated sizes fit a Layout");
        // SAFETY: layout has non-zero size (the header alone is 768 bytes).
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        // SAFETY: HEADER_BYTES is inside the allocation.
        let slots = unsafe { ptr.add(HEADER_BYTES as usize) };
        let region = Region::from_parts(ptr as *const RingHeader, slots, config, Backing::Heap { ptr, layout });
        region.init_header(config);
        Ok(region)
    }

    /// A copy of a ring image (header and slots, as a ring file holds them) on the heap,
    /// checked by the same `validate_header` as [`Region::attach`]. For fuzzing those checks.
    #[cfg(not(loom))]
    pub(crate) fn from_image(image: &[u8]) -> Result<Region, AttachError> {
        let path = Path::new("(image)");
        let len = image.len() as u64;
        if len < HEADER_BYTES as u64 {
            return Err(AttachError::TooShort { path: path.to_owned(), len, need: HEADER_BYTES as u64 });
        }
        let layout = std::alloc::Layout::from_size_align(image.len(), 128).expect("a slice's length fits a Layout");
        // SAFETY: layout has non-zero size (at least HEADER_BYTES).
        let ptr = unsafe { std::alloc::alloc(layout) };
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        // SAFETY: `ptr` is a fresh allocation of `image.len()` bytes, so it cannot overlap `image`.
        unsafe { std::ptr::copy_nonoverlapping(image.as_ptr(), ptr, image.len()) };
        // SAFETY: the allocation holds at least HEADER_BYTES, 128-aligned, all initialized;
        // the header is all atomics and padding, for which any bytes are valid.
        let header = unsafe { &*(ptr as *const RingHeader) };
        let config = validate_header(path, header, len).inspect_err(|_| {
            // SAFETY: allocated above with `layout`; no Region owns it yet.
            unsafe { std::alloc::dealloc(ptr, layout) }
        })?;
        // SAFETY: validate_header checked that the image holds header + slot_count * slot_bytes.
        let slots = unsafe { ptr.add(HEADER_BYTES as usize) };
        Ok(Region::from_parts(ptr as *const RingHeader, slots, &config, Backing::Heap { ptr, layout }))
    }

    /// A ring on the heap, built from loom atomics.
    #[cfg(loom)]
    pub(crate) fn heap(config: &RingConfig) -> Result<Region, ConfigError> {
        config.validate()?;
        let header = Box::new(RingHeader::new_zeroed());
        let words = (config.ring_bytes() / 8) as usize;
        let slots: Box<[std::cell::UnsafeCell<u64>]> = (0..words).map(|_| std::cell::UnsafeCell::new(0)).collect();
        let header_ptr: *const RingHeader = &*header;
        let slots_ptr = slots.as_ptr() as *mut u8;
        let region =
            Region::from_parts(header_ptr, slots_ptr, config, Backing::Loom { _header: header, _slots: slots });
        region.init_header(config);
        Ok(region)
    }

    /// A ring in anonymous shared memory, for channels inside one process.
    #[cfg(not(loom))]
    pub(crate) fn anonymous(config: &RingConfig) -> Result<Region, ConfigError> {
        config.validate()?;
        // Populated: faulted in now, not on the first lap (see `create_file`).
        let mut map = memmap2::MmapOptions::new()
            .len(config.region_bytes() as usize)
            .populate()
            .map_anon()
            .unwrap_or_else(|e| panic!("mmap of {} anonymous bytes failed: {e}", config.region_bytes()));
        let base = map.as_mut_ptr();
        // SAFETY: the mapping is region_bytes long, so HEADER_BYTES is inside it.
        let slots = unsafe { base.add(HEADER_BYTES as usize) };
        let region = Region::from_parts(base as *const RingHeader, slots, config, Backing::Anon { _map: map });
        region.init_header(config);
        Ok(region)
    }

    /// Create a ring file at `path`: its directory is made 0700 if missing and must be
    /// 0700 and ours if present; the file is created O_EXCL | O_NOFOLLOW, mode 0600.
    #[cfg(not(loom))]
    pub(crate) fn create_file(path: &Path, config: &RingConfig) -> Result<Region, CreateError> {
        use crate::private_file::create_private;
        config.validate()?;
        let io = |source| CreateError::Io { path: path.to_owned(), source };
        let file = create_private(path, config.region_bytes()).map_err(CreateError::from)?;
        // SAFETY: the file is ours (just created O_EXCL, 0600, in a 0700 directory); others
        // that map it are peers following the ring protocol, and every shared word is atomic.
        // Populated (MAP_POPULATE): the ring's pages are faulted in here, at start, rather
        // than one by one on the first lap, in the middle of the data path — a fresh ring of
        // 512 KiB moved 8-byte records at 0.53 ns each against 0.28 populated
        // (`hot_path threads`). The ring is budgeted whole either way.
        let mut map = unsafe { memmap2::MmapOptions::new().populate().map_mut(&file) }.map_err(io)?;
        let base = map.as_mut_ptr();
        // SAFETY: the mapping is region_bytes long.
        let slots = unsafe { base.add(HEADER_BYTES as usize) };
        let region = Region::from_parts(
            base as *const RingHeader,
            slots,
            config,
            Backing::File { _map: map, path: path.to_owned() },
        );
        region.init_header(config);
        Ok(region)
    }

    /// Create a ring as sealed shared memory reachable at `path`
    /// ([`crate::private_file::create_sealed`]): a peer that maps it can write records but
    /// can neither shrink nor grow it, so no truncation can make our accesses fault
    /// (SIGBUS), and replacing what `path` names does not change the memory we map.
    #[cfg(not(loom))]
    pub(crate) fn create_sealed(
        path: &Path,
        config: &RingConfig,
        next_seq: u64,
        durable_seq: u64,
    ) -> Result<Region, CreateError> {
        use crate::private_file::create_sealed;
        config.validate()?;
        let io = |source| CreateError::Io { path: path.to_owned(), source };
        let memfd = create_sealed(path, config.region_bytes()).map_err(CreateError::from)?;
        // SAFETY: memory we just created, 0600, sealed against resizing; peers that map it
        // follow the ring protocol, every shared word is atomic, and every bound read from
        // it is checked. Populated, as in `create_file`.
        let mut map = unsafe { memmap2::MmapOptions::new().populate().map_mut(&memfd) }.map_err(io)?;
        let base = map.as_mut_ptr();
        // SAFETY: the mapping is region_bytes long.
        let slots = unsafe { base.add(HEADER_BYTES as usize) };
        let region = Region::from_parts(
            base as *const RingHeader,
            slots,
            config,
            Backing::Sealed { _map: map, _memfd: memfd, path: path.to_owned() },
        );
        // Before the header's magic (a Release store): a peer that sees the ring sees these.
        let endpoint = &region.header().endpoint;
        endpoint.next_seq.store(next_seq, Ordering::Relaxed);
        endpoint.durable_seq.store(durable_seq, Ordering::Relaxed);
        endpoint.path_hash.store(crate::ipc::path_hash(path), Ordering::Relaxed);
        region.init_header(config);
        Ok(region)
    }

    /// Map an existing ring file, validating owner, mode, magic, version and layout
    /// before any slot is touched. A symlink is refused, except the link a sealed ring is
    /// reached by ([`Region::create_sealed`]): ours, to `/proc/<pid>/fd/<n>`, naming memory
    /// sealed against shrinking (checked on what was opened).
    #[cfg(not(loom))]
    pub(crate) fn attach(path: &Path) -> Result<Region, AttachError> {
        use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
        let io = |source| AttachError::Io { path: path.to_owned(), source };
        // A sealed ring's link: open what it names, as read once (a link swapped meanwhile
        // changes nothing), non-blocking (it could name a FIFO), and check it below.
        let sealed = sealed_link(path);
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(match sealed {
                Some(_) => libc::O_CLOEXEC | libc::O_NONBLOCK,
                None => libc::O_NOFOLLOW | libc::O_CLOEXEC,
            })
            .open(sealed.as_deref().unwrap_or(path))
            .map_err(|e| {
                if e.raw_os_error() == Some(libc::ELOOP) { AttachError::Symlink(path.to_owned()) } else { io(e) }
            })?;
        if sealed.is_some() && !crate::private_file::is_sealed(&file) {
            return Err(AttachError::Symlink(path.to_owned()));
        }
        let meta = file.metadata().map_err(io)?;
        if !meta.file_type().is_file() {
            return Err(AttachError::NotRegular(path.to_owned()));
        }
        // SAFETY: geteuid has no preconditions and cannot fail.
        let our_uid = unsafe { libc::geteuid() };
        if meta.uid() != our_uid {
            return Err(AttachError::NotOwner { path: path.to_owned(), uid: meta.uid(), our_uid });
        }
        if meta.mode() & 0o777 != 0o600 {
            return Err(AttachError::Mode { path: path.to_owned(), mode: meta.mode() & 0o7777 });
        }
        if meta.len() < HEADER_BYTES as u64 {
            return Err(AttachError::TooShort { path: path.to_owned(), len: meta.len(), need: HEADER_BYTES as u64 });
        }
        // SAFETY: owner and mode are checked; the mapping is only read through atomics
        // until the layout is validated below. Not populated: the file's size is not yet
        // known to be a ring's (its creator populated the pages; ours fault in cheaply).
        let mut map = unsafe { memmap2::MmapOptions::new().map_mut(&file) }.map_err(io)?;
        let base = map.as_mut_ptr();
        // SAFETY: the mapping holds at least HEADER_BYTES, page aligned.
        let header = unsafe { &*(base as *const RingHeader) };
        let config = validate_header(path, header, meta.len())?;
        // SAFETY: validate_header checked that the file holds header + slot_count * slot_bytes.
        let slots = unsafe { base.add(HEADER_BYTES as usize) };
        Ok(Region::from_parts(
            base as *const RingHeader,
            slots,
            &config,
            Backing::File { _map: map, path: path.to_owned() },
        ))
    }
}

/// If `path` is a link of ours to `/proc/<pid>/fd/<n>` (how a sealed ring is reached), that
/// target. What it names is checked after opening it (owner, mode, seals), like any ring file.
#[cfg(not(loom))]
fn sealed_link(path: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::symlink_metadata(path).ok()?;
    if !meta.file_type().is_symlink() || meta.uid() != crate::private_file::our_uid() {
        return None;
    }
    let target = std::fs::read_link(path).ok()?;
    let parts: Vec<_> = target.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
    let ok = matches!(parts.as_slice(), [root, proc_, pid, fd, n]
        if root == "/" && proc_ == "proc" && fd == "fd"
            && pid.parse::<u32>().is_ok() && n.parse::<u32>().is_ok());
    ok.then_some(target)
}

/// Check every header field against itself and the file length; return the layout.
#[cfg(not(loom))]
pub(crate) fn validate_header(path: &Path, h: &RingHeader, file_len: u64) -> Result<RingConfig, AttachError> {
    // SYNC POINT Acquire: pairs with the Release store of `magic` in `Region::init_header`.
    let magic = h.magic.load(Ordering::Acquire);
    if magic != MAGIC {
        return Err(AttachError::Magic { path: path.to_owned(), found: magic, expected: MAGIC });
    }
    let version = h.version.load(Ordering::Relaxed);
    if version != VERSION {
        return Err(AttachError::Version { path: path.to_owned(), found: version, expected: VERSION });
    }
    let layout_err = |what: String| AttachError::Layout { path: path.to_owned(), what };
    let header_bytes = h.header_bytes.load(Ordering::Relaxed);
    if header_bytes != HEADER_BYTES {
        return Err(layout_err(format!("header of {header_bytes} bytes, this build expects {HEADER_BYTES}")));
    }
    let config = RingConfig {
        slot_bytes: h.slot_bytes.load(Ordering::Relaxed),
        slot_count: h.slot_count.load(Ordering::Relaxed),
        max_record_bytes: h.max_record_bytes.load(Ordering::Relaxed),
    };
    config.validate().map_err(|e| layout_err(e.to_string()))?;
    if config.region_bytes() != file_len {
        return Err(layout_err(format!(
            "header says {} slots x {} bytes = {} bytes with the header, the file has {file_len}",
            config.slot_count,
            config.slot_bytes,
            config.region_bytes()
        )));
    }
    let tail = h.tail.value.load(Ordering::Acquire);
    let head = h.head.value.load(Ordering::Acquire);
    // `head` may pass the stored `tail` by what one publish committed (the producer stores
    // `tail` after the headers, see the layout docs); taking a role checks it exactly.
    if tail.abs_diff(head) > config.slot_count as u64 {
        return Err(layout_err(format!("positions out of range: tail {tail}, head {head}")));
    }
    Ok(config)
}

impl Drop for Region {
    fn drop(&mut self) {
        #[cfg(not(loom))]
        if let Backing::Heap { ptr, layout } = self.backing {
            // SAFETY: allocated in `Region::heap` with exactly this layout, freed once.
            unsafe { std::alloc::dealloc(ptr, layout) };
        }
    }
}
