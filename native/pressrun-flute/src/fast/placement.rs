//! Where an object's bytes go: its buffer in memory (`Mapping`: the pages brought in
//! as the symbols first reach them, given back as its blocks complete) and its file
//! on disk (`preallocate`: the disk blocks given at once).

use std::fs::File;

use super::{thread_cpu_s, Bits};

/// Bytes of a memory page.
const PAGE: usize = 4096;
/// Bytes of a 2 MB transparent huge page: a completed block's pages of the object's
/// buffer are given back in whole pages of this size (a part of a huge page given
/// back would split it).
const HUGE_PAGE: usize = 2 << 20;
/// Bytes of the object's buffer brought in at once (`Mapping::touch`): 64 pages in one
/// system call.
const POPULATE_BYTES: usize = 256 << 10;
/// Thread CPU seconds past which bringing in one piece of the buffer in huge pages
/// (`Mapping::touch`; a piece that faults a fresh 2 MB page) means huge pages come
/// dear: the rest of the buffer is then taken in 4 kB pages. A huge page costs
/// 0.08 ms on this VM when the guest's memory behind it is backed and 2.5-5 ms when
/// the host must back it first; 2 MB in 4 kB pages costs 0.7-1 ms either way
/// (docs/results/2026-11-28-multicast-receive-cpu.md, session 22).
const HUGE_PAGE_DEAR_S: f64 = 1e-3;

/// A memory mapping that is unmapped when dropped.
pub(super) struct Mapping {
    ptr: *mut u8,
    len: usize,
    /// the POPULATE_BYTES pieces of the mapping brought in so far (`touch`)
    brought: Bits,
    /// whether the kernel takes MADV_POPULATE_WRITE (Linux 5.14 and later); without it
    /// the pages come by faults as the symbols are written, uncounted
    populate: bool,
    /// whether the mapping still asks for transparent huge pages (MADV_HUGEPAGE):
    /// until a piece brought in them costs more than HUGE_PAGE_DEAR_S
    huge: bool,
    /// thread CPU seconds spent bringing pages in (`touch`)
    pub(super) cpu_s: f64,
}

impl Mapping {
    /// ``len`` bytes of anonymous memory, in transparent huge pages where the kernel
    /// has them (MADV_HUGEPAGE) until they come dear (`touch`): on this VM a huge
    /// page costs a tenth of 4 kB pages when the guest's memory behind it is backed,
    /// and 3-5 times as much when it is not, as for most first objects of a process
    /// (the host backs the guest's free 2 MB blocks lazily; docs/results/
    /// 2026-11-28-multicast-receive-cpu.md, session 22).
    pub(super) fn new(len: usize) -> std::io::Result<Self> {
        if len == 0 {
            return Ok(Self {
                ptr: std::ptr::null_mut(),
                len: 0,
                brought: Bits::default(),
                populate: false,
                huge: false,
                cpu_s: 0.0,
            });
        }
        // SAFETY: a fresh private anonymous mapping of len bytes
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: the range is the mapping just made; a refusal only costs speed
        let huge = unsafe { libc::madvise(ptr, len, libc::MADV_HUGEPAGE) } == 0;
        Ok(Self {
            ptr: ptr.cast(),
            len,
            brought: Bits::default(),
            populate: true,
            huge,
            cpu_s: 0.0,
        })
    }

    /// Bring in the pages of ``start..end`` before they are written: each
    /// POPULATE_BYTES piece of the mapping the range reaches that is not in yet is
    /// populated with one MADV_POPULATE_WRITE (a huge page, or 64 small ones in one
    /// system call instead of a fault each), its thread CPU counted in `cpu_s`:
    /// fresh memory, the receive path's largest cost beyond the bare loop and the
    /// decode for a receiver's first object on this VM (docs/multicast.md, "Receiver
    /// CPU"), told apart from the loop's own work. A piece that cost more than
    /// HUGE_PAGE_DEAR_S while huge pages were asked for turns them off for the rest
    /// (MADV_NOHUGEPAGE: the pages already in stay as they are).
    pub(super) fn touch(&mut self, start: usize, end: usize) {
        let end = end.min(self.len);
        if !self.populate || end <= start {
            return;
        }
        for piece in start / POPULATE_BYTES..=(end - 1) / POPULATE_BYTES {
            if !self.brought.insert(piece) {
                continue;
            }
            let lo = piece * POPULATE_BYTES;
            // the mapping's last page is whole (mmap rounds its length up)
            let hi = ((piece + 1) * POPULATE_BYTES).min(self.len.next_multiple_of(PAGE));
            let cpu0 = thread_cpu_s();
            // SAFETY: whole pages of the mapping (it starts on a page); populating
            // only faults them in
            let done = unsafe {
                libc::madvise(self.ptr.add(lo).cast(), hi - lo, libc::MADV_POPULATE_WRITE)
            };
            let cpu = thread_cpu_s() - cpu0;
            self.cpu_s += cpu;
            if done != 0 {
                // an older kernel (EINVAL): the writes fault the pages in as before
                self.populate = false;
                return;
            }
            if self.huge && cpu > HUGE_PAGE_DEAR_S {
                self.huge = false;
                // SAFETY: the whole mapping; a refusal only costs speed
                unsafe { libc::madvise(self.ptr.cast(), self.len, libc::MADV_NOHUGEPAGE) };
            }
        }
    }

    pub(super) fn bytes(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: the mapping is len bytes, readable, and lives as long as self
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    pub(super) fn bytes_mut(&mut self) -> &mut [u8] {
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: as above, and &mut self makes the borrow unique
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    /// Give back the whole 2 MB pages inside ``start..end`` (MADV_DONTNEED: they
    /// read as zeros if touched again); a partial page at either end is kept.
    pub(super) fn release(&mut self, start: usize, end: usize) {
        let base = self.ptr as usize;
        let from = (base + start).next_multiple_of(HUGE_PAGE);
        let to = (base + end.min(self.len)) / HUGE_PAGE * HUGE_PAGE;
        if to > from {
            // SAFETY: a range of whole pages inside the mapping, which nothing reads
            // again (its block is written and done)
            unsafe { libc::madvise(from as *mut libc::c_void, to - from, libc::MADV_DONTNEED) };
        }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        if self.len > 0 {
            // SAFETY: ptr/len are the mapping made in `new`
            unsafe { libc::munmap(self.ptr.cast(), self.len) };
        }
    }
}

/// Give the object's file its disk blocks at once (`fallocate` with
/// FALLOC_FL_KEEP_SIZE: the size still grows only as blocks are written), so each
/// block's write goes into blocks the file already has. With ext4's delayed
/// allocation each page written reserved its block and recorded a delayed extent
/// (`ext4_da_get_block_prep`, a third of the writes' CPU in the profile): file
/// writes 0.15-0.17 us a packet against 0.24-0.37 in the replay
/// (`examples/receive_cost.rs`, 29 Nov; docs/results/2026-11-29-receiver-cpu.md),
/// the fallocate's own CPU counted with the writes. Only speed: a file system that
/// cannot (EOPNOTSUPP) or a disk without the room writes as before, and a write
/// that then fails ends the object as before. Not on tmpfs, whose blocks are
/// memory: there it would hold the whole object beside the object's buffer from
/// the first packet.
pub(super) fn preallocate(file: &File, length: u64) {
    use std::os::fd::AsRawFd;
    let Ok(length) = libc::off_t::try_from(length) else {
        return;
    };
    if length == 0 {
        return;
    }
    let fd = file.as_raw_fd();
    // SAFETY: a zeroed statfs for the call to fill
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid descriptor and a statfs to fill
    if unsafe { libc::fstatfs(fd, &mut fs) } != 0 || fs.f_type == libc::TMPFS_MAGIC {
        return;
    }
    // SAFETY: a valid descriptor of a file this object owns; no memory is passed
    unsafe { libc::fallocate(fd, libc::FALLOC_FL_KEEP_SIZE, 0, length) };
}
