//! `agent set-network` and `agent network-log`: an agent's egress
//! allow-list (the operator's, kept outside the agent's tree) and the
//! record of every attempt its commands made through the proxy.

use serde_json::json;

use crate::console::output::{self, Table, field as f};
use crate::egress::allow::AllowList;
use crate::paths::Home;
use crate::store;

/// `agent set-network AGENT (--allow HOST[:PORT]… | --none) [--json]`.
pub fn set(
    home: &Home,
    agent: &str,
    allow: &[String],
    none: bool,
    json: bool,
) -> anyhow::Result<()> {
    let (record, _) = store::find(home, Some(agent))?;
    if allow.is_empty() && !none {
        anyhow::bail!(
            "say what agent {} may reach: --allow HOST[:PORT] (repeatable), or --none for nothing",
            record.name
        );
    }
    let list = AllowList::parse(allow).map_err(|e| anyhow::anyhow!("--allow {e}"))?;
    crate::egress::policy::write(home, &record.id, &list)?;
    let entries = list.to_strings();
    if json {
        output::json(&json!({
            "agent": record.id,
            "name": record.name,
            "network": { "allow": entries },
        }))?;
    } else if entries.is_empty() {
        println!(
            "agent {} ({}): no network (nothing allowed)",
            f(&record.name),
            f(&record.id)
        );
    } else {
        let shown: Vec<String> = entries.iter().map(|e| f(e).into_owned()).collect();
        println!(
            "agent {} ({}): network through the proxy to {}",
            f(&record.name),
            f(&record.id),
            shown.join(", ")
        );
    }
    Ok(())
}

/// The list as `agent show` reports it: `{"allow": [...]}`, or the reason
/// it cannot be read.
pub fn shown(home: &Home, id: &str) -> serde_json::Value {
    match crate::egress::policy::read(home, id) {
        Ok(list) => json!({ "allow": list.to_strings() }),
        Err(e) => json!({ "allow": [], "error": e.to_string() }),
    }
}

/// The one line `agent show` prints.
pub(crate) fn show_line(home: &Home, id: &str) -> String {
    match crate::egress::policy::read(home, id) {
        Ok(list) if list.is_empty() => "none (agent set-network to allow hosts)".into(),
        Ok(list) => {
            let shown: Vec<String> = list
                .to_strings()
                .iter()
                .map(|e| f(e).into_owned())
                .collect();
            format!("through the proxy to {}", shown.join(", "))
        }
        Err(e) => format!("unreadable ({})", output::text(&e.to_string())),
    }
}

/// `agent network-log [AGENT] [--since T] [--json]`.
pub fn log(
    home: &Home,
    agent: Option<&str>,
    since: Option<&str>,
    json: bool,
) -> anyhow::Result<()> {
    let (record, _) = store::find(home, agent)?;
    let since = since
        .map(|s| crate::recall::search::Filters::parse_date(s, false))
        .transpose()?
        .map(time::OffsetDateTime::from_unix_timestamp)
        .transpose()?;
    let records = crate::egress::log::read(home, &record.id, since)?;
    if json {
        return output::json(&json!({ "agent": record.id, "records": records }));
    }
    if records.is_empty() {
        println!(
            "no network attempts recorded for agent {} ({})",
            f(&record.name),
            f(&record.id)
        );
        return Ok(());
    }
    let mut table = Table::new(&[
        "TIME", "ROLE", "CHILD", "METHOD", "HOST", "PORT", "VERDICT", "UP", "DOWN", "MS", "REASON",
    ]);
    for col in [2, 5, 7, 8, 9] {
        table = table.right(col);
    }
    for r in &records {
        table.row(vec![
            output::display_stored_time(&r.time),
            r.role.clone(),
            r.child.to_string(),
            r.method.clone(),
            r.host.clone(),
            r.port.map(|p| p.to_string()).unwrap_or_default(),
            match r.verdict {
                crate::egress::log::Verdict::Allowed => "allowed".into(),
                crate::egress::log::Verdict::Denied => "DENIED".into(),
            },
            r.bytes_up.to_string(),
            r.bytes_down.to_string(),
            r.duration_ms.to_string(),
            r.reason.clone().unwrap_or_default(),
        ]);
    }
    table.print()?;
    Ok(())
}
