//! `POST /nodes/{node}/vzdump`: a backup of guests to a storage, as a `vzdump` task that
//! writes one backup volume per guest (issue 19, item 7).
//!
//! Modelled from pve-manager @ 14a22df3:
//! * `PVE/API2/VZDump.pm` `vzdump`: `Datastore.AllocateSpace` on the storage is checked
//!   before the worker; guests on other nodes are skipped, silently (`OK`, no task) when no
//!   guest of the list is on this node; the task is `vzdump` with the vmid as its id when
//!   there is one guest. `VM.Backup` on each guest is checked by `PVE::VZDump->new`
//!   (`check_vmids`, before the worker in the real code path `get_included_guests`; *assumed*
//!   to be a 403 before the task here).
//! * `PVE/VZDump.pm` `new`: a storage without content `backup` fails the task with `could
//!   not get storage information for '<sid>': can't use storage '<sid>' for backups - wrong
//!   content type` (`storage_info`, `$add_error`, `die "$errors\n"`).
//! * `PVE/VZDump.pm` `exec_backup_task`: the archive is `vzdump-<qemu|lxc>-<vmid>-
//!   <%Y_%m_%d-%H_%M_%S>` in the storage's `dump` directory, `.vma` (qemu) or `.tar` (lxc)
//!   plus the compressor's extension (`zstd`: `.zst`, `gzip`: `.gz`, `lzo`: `.lzo`); the
//!   volume is `<sid>:backup/<file>`; the log says `creating vzdump archive '<path>'`, then
//!   `adding notes to backup` when `notes-template` is set (`$generate_notes` fills
//!   `{{guestname}}`, `{{vmid}}`, `{{node}}`, `{{cluster}}`). A failed guest logs `ERROR:
//!   Backup of VM <vmid> failed - <error>` and the job ends `job errors` (`exec_backup`).
//! * The log lines of a real run: /work/shared/testdata/pve/task-log-vzdump.cpx-backup.json.
//!
//! A failure injected for task type `vzdump` (`SimControl::fail_next_task`) fails the guest's
//! backup with that message: no volume is written and the task ends `job errors`. The sim
//! keeps `remove` (prune older backups) unmodelled: it never removes a backup; *assumed*
//! harmless, as ProxOps sends `remove=0`.

use std::sync::Arc;

use serde_json::Value;

use super::Ctx;
use crate::cluster::now_epoch;
use crate::error::{ApiError, ApiResult};
use crate::guest::Kind;
use crate::storage::Volume;
use crate::task::{self, TaskSpec, Work};

/// The file extension of the compressor `compress` names (`compressor_info`; `1` is lzo).
fn compressor_ext(compress: &str) -> Result<Option<&'static str>, ApiError> {
    match compress {
        "0" => Ok(None),
        "1" | "lzo" => Ok(Some("lzo")),
        "gzip" => Ok(Some("gz")),
        "zstd" => Ok(Some("zst")),
        other => Err(ApiError::param(
            "compress",
            format!(
                "value '{other}' does not have a value in the enumeration '0, 1, gzip, lzo, zstd'"
            ),
        )),
    }
}

/// `(year, month, day, hour, minute, second)` of a Unix time in UTC (the simulator's local
/// time), by Howard Hinnant's `civil_from_days`.
pub(crate) fn civil(epoch: u64) -> (i64, u32, u32, u32, u32, u32) {
    let secs = i64::try_from(epoch).unwrap_or(i64::MAX);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (
        year,
        month,
        day,
        (rem / 3600) as u32,
        ((rem % 3600) / 60) as u32,
        (rem % 60) as u32,
    )
}

/// `%F %H:%M:%S`.
fn stamp(epoch: u64) -> String {
    let (y, mo, d, h, mi, s) = civil(epoch);
    format!("{y:04}-{mo:02}-{d:02} {h:02}:{mi:02}:{s:02}")
}

/// `-%Y_%m_%d-%H_%M_%S`, as the archive name has it.
fn archive_time(epoch: u64) -> String {
    let (y, mo, d, h, mi, s) = civil(epoch);
    format!("{y:04}_{mo:02}_{d:02}-{h:02}_{mi:02}_{s:02}")
}

/// `$generate_notes`: `{{cluster}}`, `{{guestname}}`, `{{node}}`, `{{vmid}}`; `\n` and `\\`
/// unescaped.
fn notes(template: &str, cluster: &str, guestname: &str, node: &str, vmid: u32) -> String {
    let unescaped = template.replace("\\n", "\n").replace("\\\\", "\\");
    unescaped
        .replace("{{cluster}}", cluster)
        .replace("{{guestname}}", guestname)
        .replace("{{node}}", node)
        .replace("{{vmid}}", &vmid.to_string())
}

pub(super) fn vzdump(ctx: &Ctx) -> ApiResult<Value> {
    let p = &ctx.params;
    let node = ctx.node().to_string();
    let vmids: Vec<u32> = p
        .required("vmid")?
        .split([',', ' ', ';'])
        .filter(|v| !v.is_empty())
        .map(|v| {
            v.parse::<u32>()
                .map_err(|_| ApiError::param("vmid", format!("value '{v}' is not a valid vmid")))
        })
        .collect::<Result<_, _>>()?;
    // vzdump.conf's default storage is `local` (`PVE::VZDump::Common` defaults; *assumed*
    // unchanged on the node).
    let sid = p.get("storage").unwrap_or("local").to_string();
    let mode = p.get("mode").unwrap_or("snapshot").to_string();
    let compress = p.get("compress").unwrap_or("0").to_string();
    let ext = compressor_ext(&compress)?;
    let template = p.get("notes-template").map(str::to_string);
    if template.as_deref().is_some_and(|t| t.contains('\n')) {
        return Err(ApiError::param("notes-template", "contains a line feed"));
    }
    let authid = ctx.authid().to_string();
    let mut cluster = ctx.shared.cluster();
    cluster.node(&node)?;
    cluster.acl.check(
        &authid,
        &format!("/storage/{sid}"),
        &["Datastore.AllocateSpace"],
        false,
    )?;
    let local: Vec<(u32, Kind, String, bool)> = vmids
        .iter()
        .filter_map(|vmid| cluster.guests.get(vmid))
        .filter(|g| g.node == node)
        .map(|g| {
            let name_key = if g.kind == Kind::Lxc {
                "hostname"
            } else {
                "name"
            };
            let name = g
                .config
                .get(name_key)
                .cloned()
                .unwrap_or_else(|| format!("VM {}", g.vmid));
            (g.vmid, g.kind, name, g.running)
        })
        .collect();
    let missing: Vec<u32> = vmids
        .iter()
        .copied()
        .filter(|v| !cluster.guests.contains_key(v))
        .collect();
    for (vmid, ..) in &local {
        cluster
            .acl
            .check(&authid, &format!("/vms/{vmid}"), &["VM.Backup"], false)?;
    }
    // Guests on other nodes only: nothing to do here, and no task.
    if local.is_empty() && missing.is_empty() {
        return Ok(Value::String("OK".to_string()));
    }
    let storage = cluster
        .storage(&node, &sid)
        .ok()
        .filter(|s| s.enabled)
        .cloned();
    let cluster_name = cluster.name.clone();
    let mut cmdline = format!(
        "vzdump {}",
        vmids
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(" ")
    );
    for (key, value) in &p.0 {
        if !matches!(key.as_str(), "vmid" | "node") {
            cmdline.push_str(&format!(" --{key} '{value}'"));
        }
    }
    cmdline.push_str(&format!(" --node {node}"));
    let task_id = if vmids.len() == 1 {
        vmids[0].to_string()
    } else {
        String::new()
    };
    let started = now_epoch();
    let work_node = node.clone();
    let work: Work = Box::new(move |cluster, log, injected| {
        log.push(format!("INFO: starting new backup job: {cmdline}"));
        let Some(def) = storage else {
            return Err(format!(
                "could not get storage information for '{sid}': storage '{sid}' does not exist"
            ));
        };
        if !def.has_content("backup") {
            return Err(format!(
                "could not get storage information for '{sid}': can't use storage '{sid}' for backups - wrong content type"
            ));
        }
        let mut errors = 0;
        for vmid in &missing {
            log.push(format!(
                "ERROR: Backup of VM {vmid} failed - unable to find VM {vmid}"
            ));
            errors += 1;
        }
        let mut injected = injected;
        for (vmid, kind, name, running) in &local {
            let vmtype = if *kind == Kind::Lxc { "lxc" } else { "qemu" };
            log.push(format!("INFO: Starting Backup of VM {vmid} ({vmtype})"));
            log.push(format!("INFO: Backup started at {}", stamp(now_epoch())));
            log.push(format!(
                "INFO: status = {}",
                if *running { "running" } else { "stopped" }
            ));
            log.push(format!("INFO: backup mode: {mode}"));
            if let Some(error) = injected.take() {
                log.push(format!("ERROR: Backup of VM {vmid} failed - {error}"));
                log.push(format!("INFO: Failed at {}", stamp(now_epoch())));
                errors += 1;
                continue;
            }
            let base = if *kind == Kind::Lxc { ".tar" } else { ".vma" };
            let suffix = ext.map(|e| format!(".{e}")).unwrap_or_default();
            let file = format!(
                "vzdump-{vmtype}-{vmid}-{}{base}{suffix}",
                archive_time(started)
            );
            log.push(format!(
                "INFO: creating vzdump archive '{}/{file}'",
                def.content_dir("backup")
            ));
            let size: u64 = cluster
                .guests
                .get(vmid)
                .map(crate::guest::Guest::maxdisk)
                .unwrap_or(0)
                / 4;
            let notes = template
                .as_deref()
                .map(|t| notes(t, &cluster_name, name, &work_node, *vmid));
            if notes.is_some() {
                log.push("INFO: adding notes to backup".to_string());
            }
            let format = format!("{}{suffix}", base.trim_start_matches('.'));
            cluster
                .put_volume(
                    &work_node,
                    &sid,
                    &format!("backup/{file}"),
                    Volume {
                        content: "backup".to_string(),
                        format,
                        size,
                        ctime: started,
                        vmid: Some(*vmid),
                        checksums: std::collections::BTreeMap::new(),
                        notes,
                    },
                )
                .map_err(|e| e.text())?;
            log.push(format!("INFO: Finished Backup of VM {vmid} (00:00:01)"));
            log.push(format!("INFO: Backup finished at {}", stamp(now_epoch())));
        }
        if errors > 0 {
            log.push("INFO: Backup job finished with errors".to_string());
            return Err("job errors".to_string());
        }
        log.push("INFO: Backup job finished successfully".to_string());
        Ok(())
    });
    let upid = task::start(
        &Arc::clone(&ctx.shared),
        &mut cluster,
        &TaskSpec {
            node: &node,
            kind: "vzdump",
            id: task_id,
            user: &authid,
        },
        work,
    );
    Ok(Value::String(upid))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn archive_names_carry_the_utc_date_and_time() {
        // 2026-12-01 15:24:59 UTC
        assert_eq!(archive_time(1_796_138_699), "2026_12_01-15_24_59");
        assert_eq!(stamp(0), "1970-01-01 00:00:00");
        assert_eq!(archive_time(951_782_400), "2000_02_29-00_00_00");
    }

    #[test]
    fn notes_templates_fill_pves_variables() {
        assert_eq!(
            notes(
                "{{guestname}} on {{node}} ({{vmid}}) in {{cluster}}\\nx",
                "c",
                "web",
                "pve1",
                100
            ),
            "web on pve1 (100) in c\nx"
        );
    }
}
