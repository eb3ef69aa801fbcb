//! Applying image layers (tar, plain or gzip or zstd) to a directory.
//!
//! Every path is resolved with `openat2(RESOLVE_IN_ROOT)`: the destination
//! acts as `/` for `..`, absolute paths and symlinks alike, so no entry of a
//! hostile layer (`../x`, `/etc/x`, a write through `link -> /`) can create
//! or change anything outside it. Entries whose names contain `..` are
//! refused outright, failing the layer.
//!
//! Two whiteout modes: `Overlay` keeps whiteouts as overlayfs expects them
//! in a lower layer (a 0:0 character device, `trusted.overlay.opaque=y`), so
//! unpacked layers can be shared between images; `Apply` deletes what a
//! whiteout hides, flattening layers into one tree where overlayfs is absent.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::io::{self, BufRead, BufReader, Read};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use rustix::fs::{AtFlags, Mode, OFlags, ResolveFlags, Timestamps};
use rustix::io::Errno;
use sha2::{Digest, Sha256};

/// What an unpack can fail with.
#[derive(Debug, thiserror::Error)]
pub enum UnpackError {
    #[error("layer entry {path:?} escapes the root ({why}); refusing the layer")]
    Hostile { path: String, why: &'static str },
    #[error("layer entry {path:?}: unsupported entry type {kind}")]
    Unsupported { path: String, kind: String },
    #[error("layer entry {path:?}: {source}")]
    Entry { path: String, source: io::Error },
    #[error("reading layer: {0}")]
    Read(#[source] io::Error),
    #[error("layer is larger than {limit} bytes uncompressed ({why}); refusing the layer")]
    TooLarge { limit: u64, why: String },
    #[error("openat2 is not available (Linux 5.6 or newer is needed to unpack images safely): {0}")]
    NoOpenat2(io::Error),
}

/// How whiteouts are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Whiteouts {
    /// As overlayfs lower-layer markers.
    Overlay,
    /// By deleting what they hide.
    Apply,
}

/// The outcome of applying one layer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Applied {
    /// `sha256:<hex>` of the uncompressed tar: the layer's DiffID.
    pub diff_id: String,
    /// Bytes of the uncompressed tar.
    pub tar_bytes: u64,
}

const OPAQUE_XATTR: &str = "trusted.overlay.opaque";

/// Wraps `r` in the decompressor its first bytes call for.
pub fn decompress<'a, R: Read + 'a>(r: R) -> io::Result<Box<dyn Read + 'a>> {
    let mut br = BufReader::with_capacity(64 * 1024, r);
    let head = br.fill_buf()?;
    if head.starts_with(&[0x1f, 0x8b]) {
        Ok(Box::new(flate2::bufread::MultiGzDecoder::new(br)))
    } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        let d = ruzstd::decoding::StreamingDecoder::new(br)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("zstd: {e}")))?;
        Ok(Box::new(d))
    } else {
        Ok(Box::new(br))
    }
}

/// Counts and hashes what passes through, and stops past `limit` bytes.
struct Hashing<R> {
    inner: R,
    hash: Sha256,
    bytes: u64,
    limit: u64,
}

/// The error a read past the budget returns; recognized after the fact.
const OVER_BUDGET: &str = "layer over its size budget";

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hash.update(&buf[..n]);
        self.bytes += n as u64;
        if self.bytes > self.limit {
            return Err(io::Error::new(io::ErrorKind::FileTooLarge, OVER_BUDGET));
        }
        Ok(n)
    }
}

/// The components of an entry path, with `.` and empty parts dropped.
/// A `..` anywhere is hostile: no legitimate layer needs one.
fn components(raw: &[u8]) -> Result<Vec<&OsStr>, UnpackError> {
    let mut out = Vec::new();
    for c in raw.split(|b| *b == b'/') {
        match c {
            b"" | b"." => {}
            b".." => {
                return Err(UnpackError::Hostile {
                    path: String::from_utf8_lossy(raw).into_owned(),
                    why: "'..' component",
                });
            }
            c => out.push(OsStr::from_bytes(c)),
        }
    }
    Ok(out)
}

fn join(comps: &[&OsStr]) -> Vec<u8> {
    let mut p = Vec::new();
    for (i, c) in comps.iter().enumerate() {
        if i > 0 {
            p.push(b'/');
        }
        p.extend_from_slice(c.as_bytes());
    }
    if p.is_empty() {
        p.push(b'.');
    }
    p
}

fn in_root() -> ResolveFlags {
    ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS
}

fn dir_flags() -> OFlags {
    OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC
}

/// Writes entries below one root directory, never outside it.
pub struct RootWriter {
    root: OwnedFd,
    whiteouts: Whiteouts,
}

impl RootWriter {
    /// Opens `dest` (which must exist) as the root.
    pub fn open(dest: &Path, whiteouts: Whiteouts) -> io::Result<Self> {
        let root = rustix::fs::open(dest, dir_flags(), Mode::empty())?;
        Ok(RootWriter { root, whiteouts })
    }

    /// Opens the directory at `comps` (resolved inside the root), creating
    /// missing directories on the way.
    fn dir(&self, comps: &[&OsStr]) -> io::Result<OwnedFd> {
        match rustix::fs::openat2(
            &self.root,
            join(comps),
            dir_flags(),
            Mode::empty(),
            in_root(),
        ) {
            Ok(fd) => return Ok(fd),
            Err(Errno::NOENT) => {}
            Err(e) => return Err(e.into()),
        }
        let mut cur = rustix::fs::openat2(&self.root, ".", dir_flags(), Mode::empty(), in_root())?;
        for i in 1..=comps.len() {
            let prefix = join(&comps[..i]);
            cur = match rustix::fs::openat2(
                &self.root,
                &prefix,
                dir_flags(),
                Mode::empty(),
                in_root(),
            ) {
                Ok(fd) => fd,
                Err(Errno::NOENT) => {
                    match rustix::fs::mkdirat(&cur, comps[i - 1], Mode::from_raw_mode(0o755)) {
                        Ok(()) | Err(Errno::EXIST) => {}
                        Err(e) => return Err(e.into()),
                    }
                    // Still missing after the mkdir: a dangling symlink, whose
                    // target resolved inside the image (never on the host).
                    rustix::fs::openat2(&self.root, &prefix, dir_flags(), Mode::empty(), in_root())
                        .map_err(|e| match e {
                            Errno::NOENT => io::Error::new(
                                io::ErrorKind::NotFound,
                                "a parent is a symlink to a path not in the image (links resolve inside the image, never on the host)",
                            ),
                            e => e.into(),
                        })?
                }
                Err(e) => return Err(e.into()),
            };
        }
        Ok(cur)
    }

    /// Removes `name` in `parent`, recursively if it is a directory. Never
    /// follows symlinks.
    fn remove_all(parent: &OwnedFd, name: &OsStr) -> io::Result<()> {
        match rustix::fs::unlinkat(parent, name, AtFlags::empty()) {
            Ok(()) | Err(Errno::NOENT) => return Ok(()),
            Err(Errno::ISDIR) | Err(Errno::PERM) => {}
            Err(e) => return Err(e.into()),
        }
        let dir = rustix::fs::openat(parent, name, dir_flags() | OFlags::NOFOLLOW, Mode::empty())?;
        Self::clear_dir(&dir, &HashSet::new(), &[])?;
        match rustix::fs::unlinkat(parent, name, AtFlags::REMOVEDIR) {
            Ok(()) | Err(Errno::NOENT) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Removes the children of `dir` whose paths (`base/child`) are not in
    /// `keep`.
    fn clear_dir(dir: &OwnedFd, keep: &HashSet<Vec<u8>>, base: &[u8]) -> io::Result<()> {
        let mut names = Vec::new();
        for ent in rustix::fs::Dir::read_from(dir)? {
            let ent = ent?;
            let n = ent.file_name().to_bytes();
            if n == b"." || n == b".." {
                continue;
            }
            names.push(n.to_vec());
        }
        for n in names {
            let mut full = base.to_vec();
            if !full.is_empty() {
                full.push(b'/');
            }
            full.extend_from_slice(&n);
            if keep.contains(&full) {
                continue;
            }
            Self::remove_all(dir, OsStr::from_bytes(&n))?;
        }
        Ok(())
    }

    /// Makes room for a new entry `name`: a directory stays if a directory
    /// is coming, anything else is removed.
    fn clear_for(parent: &OwnedFd, name: &OsStr, new_is_dir: bool) -> io::Result<()> {
        match rustix::fs::statat(parent, name, AtFlags::SYMLINK_NOFOLLOW) {
            Err(Errno::NOENT) => Ok(()),
            Err(e) => Err(e.into()),
            Ok(st) => {
                let is_dir = rustix::fs::FileType::from_raw_mode(st.st_mode)
                    == rustix::fs::FileType::Directory;
                if is_dir && new_is_dir {
                    Ok(())
                } else {
                    Self::remove_all(parent, name)
                }
            }
        }
    }
}

struct Meta {
    uid: u32,
    gid: u32,
    mode: u32,
    mtime: u64,
    xattrs: Vec<(Vec<u8>, Vec<u8>)>,
}

fn set_fd_meta(fd: &OwnedFd, m: &Meta, times: bool) -> io::Result<()> {
    rustix::fs::fchown(
        fd,
        Some(rustix::fs::Uid::from_raw(m.uid)),
        Some(rustix::fs::Gid::from_raw(m.gid)),
    )?;
    // After chown, which clears set-id bits.
    rustix::fs::fchmod(fd, Mode::from_raw_mode(m.mode & 0o7777))?;
    for (k, v) in &m.xattrs {
        rustix::fs::fsetxattr(fd, OsStr::from_bytes(k), v, rustix::fs::XattrFlags::empty())?;
    }
    if times {
        rustix::fs::futimens(fd, &stamp(m.mtime))?;
    }
    Ok(())
}

fn stamp(mtime: u64) -> Timestamps {
    let t = rustix::fs::Timespec {
        tv_sec: mtime.min(i64::MAX as u64) as i64,
        tv_nsec: 0,
    };
    Timestamps {
        last_access: t,
        last_modification: t,
    }
}

/// Applies one layer tar (already decompressed) below `dest`.
/// How much one layer may unpack to, and which limit set it (for the
/// message).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Budget {
    pub bytes: u64,
    pub why: String,
}

impl Budget {
    pub fn unlimited() -> Self {
        Budget {
            bytes: u64::MAX,
            why: String::new(),
        }
    }
}

/// Applies a layer; past `budget` uncompressed bytes it stops with
/// [`UnpackError::TooLarge`] (a decompression bomb, a full disk).
pub fn apply_layer(
    reader: impl Read,
    dest: &Path,
    whiteouts: Whiteouts,
    budget: &Budget,
) -> Result<Applied, UnpackError> {
    apply_layer_inner(reader, dest, whiteouts, budget.bytes).map_err(|e| {
        let over = match &e {
            UnpackError::Read(io) | UnpackError::Entry { source: io, .. } => {
                io.kind() == io::ErrorKind::FileTooLarge && io.to_string() == OVER_BUDGET
            }
            _ => false,
        };
        if over {
            UnpackError::TooLarge {
                limit: budget.bytes,
                why: budget.why.clone(),
            }
        } else {
            e
        }
    })
}

fn apply_layer_inner(
    reader: impl Read,
    dest: &Path,
    whiteouts: Whiteouts,
    limit: u64,
) -> Result<Applied, UnpackError> {
    let w = RootWriter::open(dest, whiteouts).map_err(UnpackError::Read)?;
    // Probe openat2 once, so old kernels get one clear message.
    rustix::fs::openat2(&w.root, ".", dir_flags(), Mode::empty(), in_root())
        .map_err(|e| UnpackError::NoOpenat2(e.into()))?;
    let hashing = Hashing {
        inner: reader,
        hash: Sha256::new(),
        bytes: 0,
        limit,
    };
    let mut archive = tar::Archive::new(hashing);
    let mut pass = Pass::default();
    for entry in archive.entries().map_err(UnpackError::Read)? {
        let mut entry = entry.map_err(UnpackError::Read)?;
        apply_entry(&w, &mut entry, &mut pass)?;
    }
    pass.finish(&w)?;
    let mut rest = archive.into_inner();
    io::copy(&mut rest, &mut io::sink()).map_err(UnpackError::Read)?;
    Ok(Applied {
        diff_id: format!("sha256:{}", hex::encode(rest.hash.finalize())),
        tar_bytes: rest.bytes,
    })
}

/// What one layer's pass keeps for after its entries.
#[derive(Default)]
struct Pass {
    /// Every path the layer made (kept by an opaque directory's clearing).
    created: HashSet<Vec<u8>>,
    /// Opaque directories (Apply mode), cleared of what lower layers put
    /// there once the layer is in.
    opaque: Vec<Vec<u8>>,
    /// Directories and their mtimes, set last (children change them).
    dir_times: Vec<(Vec<u8>, u64)>,
}

impl Pass {
    fn finish(self, w: &RootWriter) -> Result<(), UnpackError> {
        for dir in self.opaque {
            let comps = components(&dir)?;
            let fd = w.dir(&comps).map_err(UnpackError::Read)?;
            let base = if comps.is_empty() {
                Vec::new()
            } else {
                dir.clone()
            };
            RootWriter::clear_dir(&fd, &self.created, &base).map_err(UnpackError::Read)?;
        }
        for (dir, mtime) in self.dir_times.into_iter().rev() {
            let comps = components(&dir)?;
            if let Ok(fd) = w.dir(&comps) {
                let _ = rustix::fs::futimens(&fd, &stamp(mtime));
            }
        }
        Ok(())
    }
}

/// One tar entry applied under the root: a whiteout, or a file, directory,
/// link or node made with its owner, mode, times and xattrs.
fn apply_entry<R: Read>(
    w: &RootWriter,
    entry: &mut tar::Entry<'_, R>,
    pass: &mut Pass,
) -> Result<(), UnpackError> {
    let raw = entry.path_bytes().into_owned();
    let comps = components(&raw)?;
    let Some((name, parents)) = comps.split_last() else {
        return Ok(()); // the root itself
    };
    let path = String::from_utf8_lossy(&raw).into_owned();
    let err = |source: io::Error| UnpackError::Entry {
        path: path.clone(),
        source,
    };
    let parent = w.dir(parents).map_err(err)?;
    if let Some(hidden) = name.as_bytes().strip_prefix(b".wh.") {
        return whiteout(w, &parent, parents, hidden, pass).map_err(err);
    }
    let h = entry.header().clone();
    let meta = entry_meta(entry, &h);
    let kind = h.entry_type();
    let full = join(&comps);
    pass.created.insert(full.clone());
    RootWriter::clear_for(&parent, name, kind == tar::EntryType::Directory).map_err(err)?;
    match kind {
        tar::EntryType::Regular | tar::EntryType::Continuous => {
            write_file(&parent, name, entry, &meta).map_err(err)
        }
        tar::EntryType::Directory => {
            make_dir(&parent, name, &meta).map_err(err)?;
            pass.dir_times.push((full, meta.mtime));
            Ok(())
        }
        tar::EntryType::Symlink => {
            let target = link_target(entry, "symlink without target").map_err(err)?;
            make_symlink(&parent, name, &target, &meta).map_err(err)
        }
        tar::EntryType::Link => {
            let target = link_target(entry, "hardlink without target").map_err(err)?;
            make_hardlink(w, &parent, name, &target, &path)
        }
        tar::EntryType::Char | tar::EntryType::Block | tar::EntryType::Fifo => {
            make_node(&parent, name, kind, &h, &meta).map_err(err)
        }
        tar::EntryType::XGlobalHeader
        | tar::EntryType::XHeader
        | tar::EntryType::GNULongName
        | tar::EntryType::GNULongLink => Ok(()),
        other => Err(UnpackError::Unsupported {
            path,
            kind: format!("{other:?}"),
        }),
    }
}

/// A whiteout entry: `.wh..opq` makes its directory opaque (an xattr for
/// overlay, a clearing after the layer when applied), `.wh.<name>` removes
/// `name` (and leaves overlay's 0:0 character device in its place).
fn whiteout(
    w: &RootWriter,
    parent: &OwnedFd,
    parents: &[&OsStr],
    hidden: &[u8],
    pass: &mut Pass,
) -> io::Result<()> {
    if hidden == b".wh..opq" {
        match w.whiteouts {
            Whiteouts::Overlay => {
                rustix::fs::fsetxattr(parent, OPAQUE_XATTR, b"y", rustix::fs::XattrFlags::empty())?
            }
            Whiteouts::Apply => pass.opaque.push(join(parents)),
        }
        return Ok(());
    }
    let hidden = OsStr::from_bytes(hidden);
    RootWriter::remove_all(parent, hidden)?;
    if w.whiteouts == Whiteouts::Overlay {
        rustix::fs::mknodat(
            parent,
            hidden,
            rustix::fs::FileType::CharacterDevice,
            Mode::empty(),
            rustix::fs::makedev(0, 0),
        )?;
    }
    Ok(())
}

/// The entry's owner, mode, mtime and xattrs (overlay's markers come only
/// from whiteout entries, never from an xattr a layer carries).
fn entry_meta<R: Read>(entry: &mut tar::Entry<'_, R>, h: &tar::Header) -> Meta {
    let mut xattrs = Vec::new();
    if let Ok(Some(exts)) = entry.pax_extensions() {
        for ext in exts.flatten() {
            if let Some(k) = ext.key_bytes().strip_prefix(b"SCHILY.xattr.")
                && !k.starts_with(b"trusted.overlay.")
            {
                xattrs.push((k.to_vec(), ext.value_bytes().to_vec()));
            }
        }
    }
    Meta {
        uid: h.uid().unwrap_or(0) as u32,
        gid: h.gid().unwrap_or(0) as u32,
        mode: h.mode().unwrap_or(0o644),
        mtime: h.mtime().unwrap_or(0),
        xattrs,
    }
}

fn link_target<R: Read>(entry: &tar::Entry<'_, R>, missing: &str) -> io::Result<Vec<u8>> {
    entry
        .link_name_bytes()
        .map(|t| t.into_owned())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, missing.to_string()))
}

fn write_file(parent: &OwnedFd, name: &OsStr, data: &mut impl Read, meta: &Meta) -> io::Result<()> {
    let flags = OFlags::CREATE | OFlags::EXCL | OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let fd = rustix::fs::openat(parent, name, flags, Mode::from_raw_mode(0o600))?;
    let mut file = std::fs::File::from(fd);
    io::copy(data, &mut file)?;
    set_fd_meta(&OwnedFd::from(file), meta, true)
}

fn make_dir(parent: &OwnedFd, name: &OsStr, meta: &Meta) -> io::Result<()> {
    match rustix::fs::mkdirat(parent, name, Mode::from_raw_mode(0o755)) {
        Ok(()) | Err(Errno::EXIST) => {}
        Err(e) => return Err(e.into()),
    }
    let fd = rustix::fs::openat(parent, name, dir_flags() | OFlags::NOFOLLOW, Mode::empty())?;
    set_fd_meta(&fd, meta, false)
}

fn make_symlink(parent: &OwnedFd, name: &OsStr, target: &[u8], meta: &Meta) -> io::Result<()> {
    rustix::fs::symlinkat(OsStr::from_bytes(target), parent, name)?;
    rustix::fs::chownat(
        parent,
        name,
        Some(rustix::fs::Uid::from_raw(meta.uid)),
        Some(rustix::fs::Gid::from_raw(meta.gid)),
        AtFlags::SYMLINK_NOFOLLOW,
    )?;
    rustix::fs::utimensat(parent, name, &stamp(meta.mtime), AtFlags::SYMLINK_NOFOLLOW)?;
    Ok(())
}

/// A hard link to `target`, resolved inside the root as every target is:
/// a link to a host file finds nothing there and is refused.
fn make_hardlink(
    w: &RootWriter,
    parent: &OwnedFd,
    name: &OsStr,
    target: &[u8],
    path: &str,
) -> Result<(), UnpackError> {
    let err = |e: Errno| UnpackError::Entry {
        path: path.to_string(),
        source: e.into(),
    };
    let tcomps = components(target)?;
    let src = rustix::fs::openat2(
        &w.root,
        join(&tcomps),
        OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
        in_root(),
    )
    .map_err(|e| match e {
        Errno::NOENT => UnpackError::Hostile {
            path: path.to_string(),
            why: "hard link to a file not in the image",
        },
        e => err(e),
    })?;
    rustix::fs::linkat(&src, "", parent, name, AtFlags::EMPTY_PATH).map_err(err)
}

/// A device node or FIFO with its owner and mode.
fn make_node(
    parent: &OwnedFd,
    name: &OsStr,
    kind: tar::EntryType,
    h: &tar::Header,
    meta: &Meta,
) -> io::Result<()> {
    let ft = match kind {
        tar::EntryType::Char => rustix::fs::FileType::CharacterDevice,
        tar::EntryType::Block => rustix::fs::FileType::BlockDevice,
        _ => rustix::fs::FileType::Fifo,
    };
    let dev = rustix::fs::makedev(
        h.device_major().ok().flatten().unwrap_or(0),
        h.device_minor().ok().flatten().unwrap_or(0),
    );
    let mode = Mode::from_raw_mode(meta.mode & 0o7777);
    rustix::fs::mknodat(parent, name, ft, mode, dev)?;
    let fd = rustix::fs::openat(
        parent,
        name,
        OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    // O_PATH fds take chown/chmod through the /proc link.
    let proc = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&fd));
    rustix::fs::chown(
        proc.as_str(),
        Some(rustix::fs::Uid::from_raw(meta.uid)),
        Some(rustix::fs::Gid::from_raw(meta.gid)),
    )?;
    rustix::fs::chmod(proc.as_str(), mode)?;
    Ok(())
}

/// Whether the running kernel offers overlayfs.
pub fn overlay_supported() -> bool {
    std::fs::read_to_string("/proc/filesystems")
        .is_ok_and(|s| s.lines().any(|l| l.ends_with("\toverlay")))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};

    /// A tar built entry by entry; names are written raw so tests can craft
    /// what `tar::Builder` would refuse.
    #[derive(Default)]
    pub struct TarBuf {
        b: Vec<u8>,
    }

    impl TarBuf {
        fn header(name: &[u8], kind: tar::EntryType, size: u64, mode: u32) -> tar::Header {
            let mut h = tar::Header::new_gnu();
            h.as_old_mut().name[..name.len()].copy_from_slice(name);
            h.set_entry_type(kind);
            h.set_size(size);
            h.set_mode(mode);
            h.set_uid(0);
            h.set_gid(0);
            h.set_mtime(1_700_000_000);
            h.set_cksum();
            h
        }
        fn push(&mut self, h: tar::Header, data: &[u8]) {
            self.b.extend_from_slice(h.as_bytes());
            self.b.extend_from_slice(data);
            let pad = (512 - data.len() % 512) % 512;
            self.b.extend(std::iter::repeat_n(0u8, pad));
        }
        pub fn file(mut self, name: &str, data: &[u8], mode: u32) -> Self {
            let h = Self::header(
                name.as_bytes(),
                tar::EntryType::Regular,
                data.len() as u64,
                mode,
            );
            self.push(h, data);
            self
        }
        pub fn dir(mut self, name: &str) -> Self {
            let h = Self::header(name.as_bytes(), tar::EntryType::Directory, 0, 0o755);
            self.push(h, &[]);
            self
        }
        pub fn link(mut self, kind: tar::EntryType, name: &str, target: &str) -> Self {
            let mut h = Self::header(name.as_bytes(), kind, 0, 0o777);
            h.as_old_mut().linkname[..target.len()].copy_from_slice(target.as_bytes());
            h.set_cksum();
            self.push(h, &[]);
            self
        }
        pub fn device(mut self, name: &str, major: u32, minor: u32) -> Self {
            let mut h = Self::header(name.as_bytes(), tar::EntryType::Char, 0, 0o666);
            h.set_device_major(major).unwrap();
            h.set_device_minor(minor).unwrap();
            h.set_cksum();
            self.push(h, &[]);
            self
        }
        pub fn xattr_file(mut self, name: &str, key: &str, value: &[u8]) -> Self {
            let rec = {
                let body = format!("SCHILY.xattr.{key}=");
                let mut len = body.len() + value.len() + 2;
                len += len.to_string().len();
                let mut r = format!("{len} {body}").into_bytes();
                r.extend_from_slice(value);
                r.push(b'\n');
                r
            };
            let h = Self::header(
                b"././@PaxHeader",
                tar::EntryType::XHeader,
                rec.len() as u64,
                0o644,
            );
            self.push(h, &rec);
            self.file(name, b"x", 0o644)
        }
        pub fn finish(mut self) -> Vec<u8> {
            self.b.extend(std::iter::repeat_n(0u8, 1024));
            self.b
        }
    }

    /// vfs_cap_data revision 2, effective, permitted = CAP_NET_RAW.
    const CAP_NET_RAW: &[u8] = &[
        1, 0, 0, 2, 0, 0x20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    ];

    fn apply(tar: &[u8], dest: &Path, mode: Whiteouts) -> Result<Applied, UnpackError> {
        apply_layer(decompress(tar).unwrap(), dest, mode, &Budget::unlimited())
    }

    #[test]
    fn regular_tree_with_links_devices_and_xattrs() {
        let dir = tempfile::tempdir().unwrap();
        let tar = TarBuf::default()
            .dir("etc/")
            .file("etc/passwd", b"root:x:0:0\n", 0o644)
            .file("bin/tool", b"#!/bin/sh\n", 0o4755)
            .link(tar::EntryType::Symlink, "bin/sh", "/bin/tool")
            .link(tar::EntryType::Link, "bin/tool2", "bin/tool")
            .device("dev/null", 1, 3)
            .xattr_file("bin/ping", "security.capability", CAP_NET_RAW)
            .finish();
        let a = apply(&tar, dir.path(), Whiteouts::Overlay).unwrap();
        assert_eq!(a.tar_bytes, tar.len() as u64);
        assert_eq!(
            a.diff_id,
            format!("sha256:{}", hex::encode(Sha256::digest(&tar)))
        );
        let root = dir.path();
        assert_eq!(
            std::fs::read(root.join("etc/passwd")).unwrap(),
            b"root:x:0:0\n"
        );
        let m = std::fs::metadata(root.join("bin/tool")).unwrap();
        assert_eq!(m.permissions().mode() & 0o7777, 0o4755);
        assert_eq!(m.mtime(), 1_700_000_000);
        assert_eq!(
            std::fs::read_link(root.join("bin/sh")).unwrap(),
            Path::new("/bin/tool")
        );
        assert_eq!(
            std::fs::metadata(root.join("bin/tool2")).unwrap().ino(),
            m.ino()
        );
        let d = std::fs::metadata(root.join("dev/null")).unwrap();
        assert!(d.file_type().is_char_device());
        assert_eq!(d.rdev(), rustix::fs::makedev(1, 3));
        let mut buf = [0u8; 32];
        let n =
            rustix::fs::getxattr(root.join("bin/ping"), "security.capability", &mut buf).unwrap();
        assert_eq!(&buf[..n], CAP_NET_RAW);
    }

    #[test]
    fn gzip_and_zstd_layers_give_the_same_diff_id() {
        let tar = TarBuf::default().file("a", b"hello", 0o644).finish();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut gz, &tar).unwrap();
        let gz = gz.finish().unwrap();
        let zst = ruzstd::encoding::compress_to_vec(
            &tar[..],
            ruzstd::encoding::CompressionLevel::Fastest,
        );
        let plain = apply(&tar, tempfile::tempdir().unwrap().path(), Whiteouts::Apply).unwrap();
        for c in [&gz, &zst] {
            let d = tempfile::tempdir().unwrap();
            assert_eq!(apply(c, d.path(), Whiteouts::Apply).unwrap(), plain);
            assert_eq!(std::fs::read(d.path().join("a")).unwrap(), b"hello");
        }
    }

    #[test]
    fn a_layer_past_its_budget_is_refused() {
        let zeros = vec![0u8; 2 << 20];
        let tar = TarBuf::default().file("bomb", &zeros, 0o644).finish();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut gz, &tar).unwrap();
        let gz = gz.finish().unwrap();
        let d = tempfile::tempdir().unwrap();
        let budget = Budget {
            bytes: 1 << 20,
            why: "the test's limit".into(),
        };
        let e = apply_layer(
            decompress(&gz[..]).unwrap(),
            d.path(),
            Whiteouts::Apply,
            &budget,
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "layer is larger than 1048576 bytes uncompressed (the test's limit); refusing the layer"
        );
        let ok = Budget {
            bytes: 4 << 20,
            why: String::new(),
        };
        apply_layer(
            decompress(&gz[..]).unwrap(),
            d.path(),
            Whiteouts::Apply,
            &ok,
        )
        .unwrap();
    }

    #[test]
    fn whiteouts_in_overlay_and_apply_modes() {
        let lower = TarBuf::default()
            .file("keep", b"1", 0o644)
            .file("gone", b"2", 0o644)
            .file("opq/old", b"3", 0o644)
            .finish();
        let upper = TarBuf::default()
            .file(".wh.gone", b"", 0o644)
            .file("opq/new", b"4", 0o644)
            .file("opq/.wh..wh..opq", b"", 0o644)
            .finish();

        // Overlay: markers, as overlayfs reads them from a lower dir.
        let o = tempfile::tempdir().unwrap();
        apply(&upper, o.path(), Whiteouts::Overlay).unwrap();
        let wh = std::fs::symlink_metadata(o.path().join("gone")).unwrap();
        assert!(wh.file_type().is_char_device() && wh.rdev() == 0);
        let mut buf = [0u8; 4];
        let n = rustix::fs::getxattr(o.path().join("opq"), OPAQUE_XATTR, &mut buf).unwrap();
        assert_eq!(&buf[..n], b"y");

        // Apply: deletion, keeping what the same layer wrote.
        let f = tempfile::tempdir().unwrap();
        apply(&lower, f.path(), Whiteouts::Apply).unwrap();
        apply(&upper, f.path(), Whiteouts::Apply).unwrap();
        assert!(f.path().join("keep").exists());
        assert!(!f.path().join("gone").exists());
        assert!(!f.path().join("opq/old").exists());
        assert_eq!(std::fs::read(f.path().join("opq/new")).unwrap(), b"4");
    }

    /// A directory beside the root that hostile layers try to reach.
    fn sandbox() -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("root");
        let outside = d.path().join("outside");
        std::fs::create_dir_all(&root).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("victim"), b"safe").unwrap();
        (d, root, outside)
    }

    fn entries_outside(outside: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(outside)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn hostile_layers_write_nothing_outside() {
        let (_d, root, outside) = sandbox();
        let out = outside.to_str().unwrap().to_string();

        // `..` in a name: refused.
        let t = TarBuf::default()
            .file("../outside/evil", b"x", 0o644)
            .finish();
        assert!(matches!(
            apply(&t, &root, Whiteouts::Apply),
            Err(UnpackError::Hostile { .. })
        ));
        let t = TarBuf::default()
            .link(tar::EntryType::Link, "x", "../outside/victim")
            .finish();
        assert!(matches!(
            apply(&t, &root, Whiteouts::Apply),
            Err(UnpackError::Hostile { .. })
        ));

        // Absolute names land inside the root.
        let t = TarBuf::default()
            .file(&format!("{out}/abs"), b"x", 0o644)
            .finish();
        apply(&t, &root, Whiteouts::Apply).unwrap();
        assert!(root.join(out.trim_start_matches('/')).join("abs").exists());

        // Writes through symlinks that point outside stay inside.
        let t = TarBuf::default()
            .link(tar::EntryType::Symlink, "up", "../../..")
            .file("up/outside/evil1", b"x", 0o644)
            .link(tar::EntryType::Symlink, "abs", &out)
            .file("abs/evil2", b"x", 0o644)
            .link(tar::EntryType::Symlink, "victim", &format!("{out}/victim"))
            .file("victim", b"overwritten?", 0o644)
            .finish();
        apply(&t, &root, Whiteouts::Apply).unwrap();
        assert!(root.join("outside/evil1").exists());
        assert!(
            root.join(out.trim_start_matches('/'))
                .join("evil2")
                .exists()
        );
        // The symlink itself was replaced, not followed.
        assert_eq!(std::fs::read(root.join("victim")).unwrap(), b"overwritten?");

        // A hardlink to a path outside resolves inside (and is missing there).
        let t = TarBuf::default()
            .link(tar::EntryType::Link, "hl", &format!("{out}/victim"))
            .finish();
        let e = apply(&t, &root, Whiteouts::Apply).unwrap_err();
        assert!(
            e.to_string()
                .contains("hard link to a file not in the image"),
            "{e}"
        );

        // Whiteouts cannot delete outside either.
        let t = TarBuf::default()
            .link(tar::EntryType::Symlink, "w", &out)
            .file("w/.wh.victim", b"", 0o644)
            .finish();
        apply(&t, &root, Whiteouts::Apply).unwrap();

        assert_eq!(entries_outside(&outside), ["victim"]);
        assert_eq!(std::fs::read(outside.join("victim")).unwrap(), b"safe");
    }
}
