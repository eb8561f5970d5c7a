//! Small fetched packs become loose objects, as git's CLI does, so the mirror does not gain a
//! pack per fetch (issue 20).
//!
//! gix writes every received pack as a new `objects/pack/pack-*.{pack,idx}` and never
//! consolidates them; each later fetch opens every index and looks objects up in all of them,
//! so a fetch after 400 changes took twice as long as the first ones (BENCHMARKS.md, "Webhook to
//! first write, and the gix fetch"). git's CLI stores a received pack of fewer than
//! `fetch.unpackLimit` objects (else `transfer.unpackLimit`, default 100) as loose objects
//! only: git @ 1a3e64c6c4, `fetch-pack.c`, `get_pack()` runs `unpack-objects` instead of
//! `index-pack` when `ntohl(header.hdr_entries) < unpack_limit` (`static int unpack_limit =
//! 100`; `fetch_pack_config()` reads the two settings). This does the
//! same after the fact: the objects of a received pack below that count are written loose
//! (read back through the repository, so deltas are resolved), then its index and data files
//! are removed, index first (a pack without its index is never read).
//!
//! Only the agent's own fetch touches the mirror (`GitSource::fetching` is held), so no
//! reader can have the removed pack open but the caller's own repository handle; the caller
//! drops that handle right after (the next fetch opens the mirror afresh).

use std::path::Path;

use gix::ObjectId;
use gix::objs::Write as _;

/// git's default `transfer.unpackLimit` (git @ 1a3e64c6c4, `fetch-pack.c`, `unpack_limit`):
/// a pack of fewer objects is stored loose.
pub(super) const UNPACK_LIMIT: u32 = 100;

/// What [`unpack_small_pack`] did.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Unpacked {
    /// The pack was kept: it holds `UNPACK_LIMIT` objects or more.
    Kept,
    /// The pack's `objects` objects were written loose and the pack removed.
    Loose { objects: u32 },
}

/// Writes the objects of the pack `index_path`/`data_path` (just received into `repo`) as
/// loose objects and removes the pack, when it holds fewer than [`UNPACK_LIMIT`] objects.
///
/// # Errors
/// An object of the pack cannot be read or written, or the pack's files cannot be removed.
/// The pack then stays (all its objects are still in it); a loose copy already written is a
/// harmless duplicate.
pub(super) fn unpack_small_pack(
    repo: &gix::Repository,
    index_path: &Path,
    data_path: &Path,
    num_objects: u32,
) -> Result<Unpacked, gix::Error> {
    if num_objects >= UNPACK_LIMIT {
        return Ok(Unpacked::Kept);
    }
    let ids: Vec<ObjectId> = gix::odb::pack::index::File::at(index_path, repo.object_hash())?
        .iter()
        .map(|entry| entry.oid)
        .collect();
    let loose = gix::odb::loose::Store::at(repo.git_dir().join("objects"), repo.object_hash());
    for id in &ids {
        let object = repo.find_object(*id)?;
        let written = loose.write_buf(object.kind, &object.data)?;
        debug_assert_eq!(written, *id, "a loose object is stored under its own id");
    }
    for file in [index_path, data_path] {
        std::fs::remove_file(file).map_err(gix::Error::from_error)?;
    }
    Ok(Unpacked::Loose {
        objects: u32::try_from(ids.len()).unwrap_or(u32::MAX),
    })
}
