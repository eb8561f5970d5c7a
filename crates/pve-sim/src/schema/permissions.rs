//! A method's `permissions` from the vendored schema, parsed into the expression that
//! pve-manager's `rest_handler` evaluates before proxying (`RPCEnvironment.pm`
//! `check_api2_permissions` / `exec_api2_perm_check`). Only the shape lives here; evaluating
//! it against ACLs is the server's business.

use serde::Deserialize;

use super::model::RawPermissions;

/// One node of a `check` expression.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PermCheck {
    /// `["perm", "/vms/{vmid}", ["VM.Audit"], "any", 1, "require_param", "pool"]`: the
    /// privileges on the path (its `{param}`s filled from the request), all of them unless
    /// `any`; with `require_param`, the check fails when that parameter is absent.
    Perm {
        /// The path template.
        path: String,
        /// The privileges.
        privs: Vec<String>,
        /// One of them is enough.
        any: bool,
        /// A parameter that must be present for this check to pass.
        require_param: Option<String>,
    },
    /// Every sub-check must pass; the first failure is reported.
    And(Vec<PermCheck>),
    /// One sub-check must pass; failing all reports a bare `Permission check failed`.
    Or(Vec<PermCheck>),
    /// A test the simulator does not evaluate (`userid-group`, `userid-param`): refused for
    /// everyone but `root@pam`, so a gap shows as a 403 rather than as a silent grant.
    Unsupported(String),
}

/// Who may call a method.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "RawPermissions")]
pub struct Permissions {
    /// `all` (any authenticated caller; the handler may check more) or `world` (no login).
    pub user: Option<String>,
    /// The check expression, when there is one.
    pub check: Option<PermCheck>,
}

impl TryFrom<RawPermissions> for Permissions {
    type Error = String;

    fn try_from(raw: RawPermissions) -> Result<Self, String> {
        Ok(Self {
            user: raw.user,
            check: raw.check.as_ref().map(parse).transpose()?,
        })
    }
}

fn parse(value: &serde_json::Value) -> Result<PermCheck, String> {
    let items = value
        .as_array()
        .ok_or_else(|| format!("permission check is not an array: {value}"))?;
    let test = items
        .first()
        .and_then(serde_json::Value::as_str)
        .ok_or_else(|| format!("permission check without a test name: {value}"))?;
    match test {
        "and" | "or" => {
            let subs = items[1..]
                .iter()
                .map(parse)
                .collect::<Result<Vec<_>, _>>()?;
            Ok(if test == "and" {
                PermCheck::And(subs)
            } else {
                PermCheck::Or(subs)
            })
        }
        "perm" => {
            let path = items
                .get(1)
                .and_then(serde_json::Value::as_str)
                .ok_or_else(|| format!("perm check without a path: {value}"))?;
            let privs = items
                .get(2)
                .and_then(serde_json::Value::as_array)
                .ok_or_else(|| format!("perm check without privileges: {value}"))?
                .iter()
                .map(|p| p.as_str().map(str::to_owned))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| format!("perm check with a non-string privilege: {value}"))?;
            // The rest is a Perl option hash: key, value, key, value.
            let mut any = false;
            let mut require_param = None;
            for pair in items[3..].chunks(2) {
                match (pair[0].as_str(), pair.get(1)) {
                    (Some("any"), Some(v)) => any = v.as_u64() == Some(1) || v == true,
                    (Some("require_param"), Some(v)) => {
                        require_param = v.as_str().map(str::to_owned);
                    }
                    _ => return Err(format!("unknown perm check option in {value}")),
                }
            }
            Ok(PermCheck::Perm {
                path: path.to_owned(),
                privs,
                any,
                require_param,
            })
        }
        other => Ok(PermCheck::Unsupported(other.to_owned())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn download_url_needs_allocate_template_and_one_of_two_network_grants() {
        let info = crate::schema::Schema::vendored()
            .endpoint_info("POST", "/nodes/{node}/storage/{storage}/download-url")
            .unwrap();
        let check = info.permissions.unwrap().check.unwrap();
        let perm = |path: &str, privs: &[&str]| PermCheck::Perm {
            path: path.into(),
            privs: privs.iter().map(|p| (*p).to_owned()).collect(),
            any: false,
            require_param: None,
        };
        assert_eq!(
            check,
            PermCheck::And(vec![
                perm("/storage/{storage}", &["Datastore.AllocateTemplate"]),
                PermCheck::Or(vec![
                    perm("/", &["Sys.Audit", "Sys.Modify"]),
                    perm("/nodes/{node}", &["Sys.AccessNetwork"]),
                ]),
            ])
        );
    }

    #[test]
    fn any_and_require_param_options_are_read() {
        let p = parse(&serde_json::json!([
            "perm",
            "/pool/{pool}",
            ["VM.Allocate"],
            "require_param",
            "pool"
        ]))
        .unwrap();
        assert!(
            matches!(p, PermCheck::Perm { require_param: Some(ref r), any: false, .. } if r == "pool")
        );
        let p = parse(&serde_json::json!([
            "perm",
            "/vms/{vmid}",
            ["A", "B"],
            "any",
            1
        ]))
        .unwrap();
        assert!(matches!(p, PermCheck::Perm { any: true, .. }));
    }
}
