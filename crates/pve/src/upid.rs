//! `Upid`: PVE's unique task identifier, parsed with PVE's own regex.
//!
//! Every long PVE operation answers with a UPID string such as
//! `UPID:pve1:0003A1F2:01B2C3D4:6650A1B2:qmcreate:100:root@pam:`. This module parses it into
//! its fields and keeps the original text, so `Display` round-trips byte for byte (hex case
//! included). It never talks to PVE; polling a task lives in `task.rs`.

use std::fmt;
use std::str::FromStr;
use std::sync::LazyLock;

use regex::Regex;

/// PVE's parse regex (pve-common `src/PVE/UPID.pm`); `pstart` may have 9 hex digits.
static UPID_RE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"^UPID:([a-zA-Z0-9]([a-zA-Z0-9\-]*[a-zA-Z0-9])?):([0-9A-Fa-f]{8}):([0-9A-Fa-f]{8,9}):([0-9A-Fa-f]{8}):([^:\s/]+):([^:\s/]*):([^:\s/]+):$",
    )
    .expect("the UPID pattern is a valid regex")
});

/// A parsed PVE task id (UPID).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Upid {
    raw: String,
    node: String,
    pid: u32,
    pstart: u64,
    starttime: u32,
    task_type: String,
    id: String,
    user: String,
}

/// Why a string is not a UPID.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a PVE task id (UPID): {value:?}")]
pub struct UpidParseError {
    /// The text that failed to parse (a UPID carries no secret).
    pub value: String,
}

impl Upid {
    /// The node the task runs on.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// The worker's process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The worker's process start time (clock ticks since boot).
    pub fn pstart(&self) -> u64 {
        self.pstart
    }

    /// The task's start time, seconds since the Unix epoch.
    pub fn starttime(&self) -> u32 {
        self.starttime
    }

    /// The task type, e.g. `qmcreate` or `download`.
    pub fn task_type(&self) -> &str {
        &self.task_type
    }

    /// The task's object id (a vmid, a file name, ...); may be empty.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The user who started the task, with the token id for token callers (`root@pam!ci`).
    pub fn user(&self) -> &str {
        &self.user
    }

    /// The UPID exactly as PVE wrote it.
    pub fn as_str(&self) -> &str {
        &self.raw
    }
}

impl FromStr for Upid {
    type Err = UpidParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || UpidParseError {
            value: s.to_owned(),
        };
        let caps = UPID_RE.captures(s).ok_or_else(err)?;
        let text = |i: usize| caps.get(i).map_or("", |m| m.as_str());
        // The regex bounds the hex widths, so these only fail on impossible input.
        let pid = u32::from_str_radix(text(3), 16).map_err(|_| err())?;
        let pstart = u64::from_str_radix(text(4), 16).map_err(|_| err())?;
        let starttime = u32::from_str_radix(text(5), 16).map_err(|_| err())?;
        Ok(Self {
            raw: s.to_owned(),
            node: text(1).to_owned(),
            pid,
            pstart,
            starttime,
            task_type: text(6).to_owned(),
            id: text(7).to_owned(),
            user: text(8).to_owned(),
        })
    }
}

impl TryFrom<String> for Upid {
    type Error = UpidParseError;

    fn try_from(value: String) -> Result<Self, Self::Error> {
        value.parse()
    }
}

impl fmt::Display for Upid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.raw)
    }
}

impl fmt::Debug for Upid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Upid({:?})", self.raw)
    }
}

impl serde::Serialize for Upid {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.raw)
    }
}

impl<'de> serde::Deserialize<'de> for Upid {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upid_parses_behaviour_example_into_fields() {
        let upid: Upid = "UPID:pve1:0003A1F2:01B2C3D4:6650A1B2:qmcreate:100:root@pam:"
            .parse()
            .unwrap();
        assert_eq!(upid.node(), "pve1");
        assert_eq!(upid.pid(), 0x0003_A1F2);
        assert_eq!(upid.pstart(), 0x01B2_C3D4);
        assert_eq!(upid.starttime(), 0x6650_A1B2);
        assert_eq!(upid.task_type(), "qmcreate");
        assert_eq!(upid.id(), "100");
        assert_eq!(upid.user(), "root@pam");
    }

    #[test]
    fn upid_display_round_trips_real_strings_exactly() {
        for s in [
            "UPID:pve1:0003A1F2:01B2C3D4:6650A1B2:qmcreate:100:root@pam:",
            // testdata/pve/task-status-vzdump-ok.cpx-backup.json
            "UPID:node1:003F8C63:1E7FB79C:67449780:vzdump:100:root@pam:",
            // testdata/pve/nodes-tasks-list.cpx-tasks_info.json
            "UPID:iaclab-01-01:00000DD3:1C419D88:6119FB65:srvreload:networking:root@pam:",
            "UPID:iaclab-01-01:000029DD:1599528B:6108F068:srvreload:networking:root@pam:",
            // testdata/pve/download-url-post.go-proxmox-pve8x.SYNTHETIC.json
            "UPID:node1:00000003:00000003:00000003:download:iso:root@pam:",
            // lower-case hex is accepted by PVE's regex and must be kept as written
            "UPID:pve-dev-01:0003a1f2:01b2c3d4:6650a1b2:download:debian.iso:root@pam!ci:",
        ] {
            let upid: Upid = s.parse().unwrap();
            assert_eq!(upid.to_string(), s);
            assert_eq!(upid.as_str(), s);
        }
    }

    #[test]
    fn upid_accepts_nine_digit_pstart_empty_id_and_token_user() {
        let upid: Upid = "UPID:node:0017C594:10ADB2769:63EC5455:imgcopy::root@pam!mytoken:"
            .parse()
            .unwrap();
        assert_eq!(upid.pstart(), 0x1_0ADB_2769);
        assert_eq!(upid.id(), "");
        assert_eq!(upid.user(), "root@pam!mytoken");
    }

    #[test]
    fn upid_rejects_mock_shapes_and_missing_trailing_colon() {
        for s in [
            // proxmoxer's mock appends a suffix after the final colon
            "UPID:node:003094EA:095F1EFE:63E88772:download:file.iso:root@pam:done",
            // the Go mock's invented format (LIVE-FACTS.md §1.2)
            "pve01@mock!create-1-2",
            "UPID:pve1:0003A1F2:01B2C3D4:6650A1B2:qmcreate:100:root@pam",
            "UPID:pve_1:0003A1F2:01B2C3D4:6650A1B2:qmcreate:100:root@pam:",
            "UPID:pve1:3A1F2:01B2C3D4:6650A1B2:qmcreate:100:root@pam:",
            "",
        ] {
            let err = s.parse::<Upid>().unwrap_err();
            assert_eq!(err.value, s);
        }
    }

    #[test]
    fn upid_serde_uses_the_plain_string() {
        let s = "\"UPID:node1:00000003:00000003:00000003:download:iso:root@pam:\"";
        let upid: Upid = serde_json::from_str(s).unwrap();
        assert_eq!(serde_json::to_string(&upid).unwrap(), s);
        assert!(serde_json::from_str::<Upid>("\"UPID:bad\"").is_err());
    }
}
