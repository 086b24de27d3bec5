//! Palace's pages, rendered with maud (every interpolated string is
//! escaped). Links are relative, so the same pages work served and from
//! `file://`: every page knows how deep it sits ([`Page::root`]).
//!
//! Layout of the site (served and exported alike):
//! `index.html`, `style.css`, `a/<id>/index.html` (memory),
//! `a/<id>/history.html`, `a/<id>/commits/<sha>.html`,
//! `a/<id>/files/<path>.html` (`?sha=` for another revision, served),
//! `a/<id>/c/<conversation>.html`, `a/<id>/search.html` (served).

use maud::{DOCTYPE, Markup, html};

use super::data::{
    AgentSummary, CommitView, ConversationView, FileView, HistoryView, MemoryView, Site,
};
use crate::store::record::AgentRecord;

/// The stylesheet (small, no framework, no JavaScript anywhere).
pub const STYLE: &str = "\
body{font-family:system-ui,sans-serif;margin:0;color:#1d1d1f;background:#fafafa}\
header{background:#23324a;color:#fff;padding:.6em 1.2em}header a{color:#fff;margin-right:1em}\
main{padding:1em 1.2em;max-width:72em}h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.6em}\
table{border-collapse:collapse;width:100%;background:#fff}th,td{text-align:left;padding:.3em .6em;\
border-bottom:1px solid #e3e3e3;vertical-align:top}th{background:#f0f2f5}\
pre{background:#fff;border:1px solid #e3e3e3;padding:.8em;overflow-x:auto;white-space:pre-wrap}\
.add{color:#116329}.del{color:#a40e26}.hunk{color:#6f42c1}.badge{font-size:.8em;padding:.1em .4em;\
border-radius:.3em;background:#e7ecf3;margin-left:.4em}.warn{color:#a35200;font-weight:600}\
.over{color:#a40e26;font-weight:700}.evicted{opacity:.6}.summary{background:#fff8e1}\
.msg{background:#fff;border:1px solid #e3e3e3;margin:.5em 0;padding:.5em .8em}\
.meta{color:#666;font-size:.85em}nav.agent a{margin-right:1em}";

/// Where a page sits, for its relative links.
pub struct Page {
    /// `../` repeated up to the site root (empty at the root).
    pub root: String,
    pub served: bool,
}

impl Page {
    pub(crate) fn at_depth(depth: usize, served: bool) -> Self {
        Self {
            root: "../".repeat(depth),
            served,
        }
    }
    fn agent_base(&self, id: &str) -> String {
        format!("{}a/{}/", self.root, id)
    }
}

/// Percent-encode a memory path for a link (each `/` kept).
pub(crate) fn url_path(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for b in path.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

fn short(sha: &str) -> &str {
    &sha[..sha.len().min(8)]
}

fn layout(page: &Page, title: &str, body: Markup) -> String {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · Palace" }
                link rel="stylesheet" href={ (page.root) "style.css" };
            }
            body {
                header { a href={ (page.root) "index.html" } { "Palace" } span { "read-only" } }
                main { (body) }
            }
        }
    }
    .into_string()
}

fn agent_nav(page: &Page, a: &AgentRecord) -> Markup {
    let base = page.agent_base(&a.id);
    html! {
        nav.agent {
            a href={ (base) "index.html" } { "Memory" }
            a href={ (base) "history.html" } { "History" }
            @if page.served { a href={ (base) "search.html" } { "Search" } }
        }
    }
}

pub fn agents(page: &Page, list: &[AgentSummary]) -> String {
    let body = html! {
        h1 { "Agents" }
        @if list.is_empty() { p { "No agents." } } @else {
            @let clustered = list.iter().any(|a| a.owner.is_some());
            table {
                tr {
                    th { "Name" } th { "Id" } th { "Model" } th { "Sandbox" } th { "Last activity" }
                    @if clustered { th { "Owner" } }
                }
                @for a in list {
                    tr {
                        td { a href={ (page.agent_base(&a.id)) "index.html" } { (a.name) } }
                        td.meta { (a.id) }
                        td { (a.model) }
                        td { (a.sandbox_level) }
                        td { (a.last_activity.as_deref().unwrap_or("-")) }
                        @if clustered { td { (a.owner.as_deref().unwrap_or("-")) } }
                    }
                }
            }
        }
    };
    layout(page, "Agents", body)
}

pub fn memory(page: &Page, v: &MemoryView) -> String {
    let base = page.agent_base(&v.agent.id);
    let body = html! {
        h1 { (v.agent.name) " — memory" }
        (agent_nav(page, &v.agent))
        p.meta { "Model " (v.agent.model) " · main at " (v.head.as_deref().map(short).unwrap_or("(none)")) }
        table {
            tr { th { "File" } th { "Role" } th { "Size" } th { "Description" } }
            @for f in &v.files {
                @let pct = f.limit.filter(|l| *l > 0).map(|l| f.chars * 100 / l);
                tr {
                    td { a href={ (base) "files/" (url_path(&f.path)) ".html" } { (f.path) } }
                    td { (f.role) }
                    td class=[match pct { Some(p) if p > 100 => Some("over"), Some(p) if p >= 80 => Some("warn"), _ => None }] {
                        (f.chars)
                        @if let Some(l) = f.limit { " / " (l) " (" (pct.unwrap_or(0)) "%)" }
                    }
                    td { (f.description) }
                }
            }
        }
        h2 { "Usage" }
        @if let Some(u) = &v.usage {
            table {
                tr { th { "Turns" } th { "Model calls" } th { "Input tokens" } th { "Output tokens" } th { "Tool calls" } th { "CPU ms" } th { "Peak memory" } }
                tr {
                    td { (u.turns) } td { (u.model_calls) } td { (u.input_tokens) } td { (u.output_tokens) }
                    td { (u.tool_calls) } td { (u.cpu_ms) } td { (u.peak_memory_bytes) " bytes" }
                }
            }
        } @else { p { "The audit log is not readable here." } }
        h2 { "Conversations" }
        @if v.conversations.is_empty() { p { "None yet." } } @else {
            table {
                tr { th { "Conversation" } th { "Messages" } th { "Last message" } }
                @for c in &v.conversations {
                    tr {
                        td { a href={ (base) "c/" (url_path(&c.id)) ".html" } { (c.id) } }
                        td { (c.messages) }
                        td { (c.last_ts.as_deref().unwrap_or("-")) }
                    }
                }
            }
        }
    };
    layout(page, &format!("{} memory", v.agent.name), body)
}

pub fn file(page: &Page, v: &FileView) -> String {
    let base = page.agent_base(&v.agent.id);
    let body = html! {
        h1 { (v.path) }
        (agent_nav(page, &v.agent))
        p.meta {
            "At commit "
            a href={ (base) "commits/" (v.commit) ".html" } { (short(&v.commit)) }
            @if v.truncated { " · shown up to " (super::MAX_FILE_BYTES) " bytes" }
        }
        pre { (v.text) }
    };
    layout(page, &v.path, body)
}

pub fn history(page: &Page, v: &HistoryView) -> String {
    let base = page.agent_base(&v.agent.id);
    let body = html! {
        h1 { (v.agent.name) " — history" }
        (agent_nav(page, &v.agent))
        table {
            tr { th { "Date" } th { "Commit" } th { "Author" } th { "Message" } th { "Changes" } }
            @for c in &v.commits {
                tr {
                    td.meta { (c.date) }
                    td { a href={ (base) "commits/" (c.sha) ".html" } { (short(&c.sha)) } }
                    td { (c.author) }
                    td { (c.subject) @if c.is_reflection { span.badge { "reflection" } } }
                    td.meta { (c.files_changed) " file(s) " span.add { "+" (c.insertions) } " " span.del { "−" (c.deletions) } }
                }
            }
        }
        @if v.more { p.meta { "Only the newest " (super::MAX_HISTORY) " commits are listed." } }
    };
    layout(page, &format!("{} history", v.agent.name), body)
}

pub fn commit(page: &Page, v: &CommitView) -> String {
    let base = page.agent_base(&v.agent.id);
    let body = html! {
        h1 { "Commit " (short(&v.summary.sha)) }
        (agent_nav(page, &v.agent))
        p.meta { (v.summary.sha) " · " (v.summary.author) " · " (v.summary.date) }
        pre { (v.message) }
        @if !v.parents.is_empty() {
            p.meta { "Parents: "
                @for p in &v.parents { a href={ (base) "commits/" (p) ".html" } { (short(p)) } " " }
            }
        }
        h2 { "Changed" }
        ul {
            @for (status, path) in &v.changed {
                li {
                    (status) " "
                    @if page.served && *status != 'D' {
                        a href={ (base) "files/" (url_path(path)) ".html?sha=" (v.summary.sha) } { (path) }
                    } @else { (path) }
                }
            }
        }
        h2 { "Diff" }
        pre {
            @for line in v.diff.lines() {
                @let class = if line.starts_with("+++") || line.starts_with("---") { None }
                    else if line.starts_with('+') { Some("add") }
                    else if line.starts_with('-') { Some("del") }
                    else if line.starts_with("@@") { Some("hunk") } else { None };
                span class=[class] { (line) } "\n"
            }
        }
        @if v.diff_truncated { p.meta { "Diff cut at " (super::MAX_DIFF_BYTES) " bytes." } }
    };
    layout(page, &format!("commit {}", short(&v.summary.sha)), body)
}

pub fn conversation(page: &Page, v: &ConversationView) -> String {
    let body = html! {
        h1 { (v.agent.name) " — " (v.id) }
        (agent_nav(page, &v.agent))
        h2 { "Context" }
        table {
            tr { th { "Tokens in context" } td { (v.tokens.map(|t| t.to_string()).unwrap_or("-".into())) } }
            tr { th { "Compaction threshold" } td { (v.threshold.map(|t| t.to_string()).unwrap_or("-".into())) } }
            tr { th { "Context window" } td { (v.window.map(|t| t.to_string()).unwrap_or("-".into())) } }
            tr { th { "Compactions" } td { (v.compactions) } }
            tr { th { "Last compaction" } td {
                @if let Some(e) = &v.last_compaction { (e.at) " (" (e.trigger) ", " (e.mode) ", " (e.messages_before) " → " (e.messages_after) " messages)" }
                @else { "none" }
            } }
        }
        h2 { "Reflection" }
        table {
            tr { th { "Steps since reflection" } td { (v.steps_since_reflection) } }
            tr { th { "Reflected through" } td { (v.reflected_through.as_deref().unwrap_or("-")) } }
            tr { th { "Last reflection" } td { (v.last_reflection.as_deref().unwrap_or("never")) } }
            tr { th { "Lock" } td {
                @match &v.lock {
                    None => "free",
                    Some(l) if l.alive => { "held by pid " (l.pid) }
                    Some(l) => { "stale (pid " (l.pid) " is gone)" }
                }
            } }
            tr { th { "Backoff" } td {
                @if let Some(b) = &v.backoff { "until " (b.retry_at) " (" (b.delay_ms / 1000) " s)" } @else { "none" }
            } }
            tr { th { "Last reflection run" } td { (outcome(v.last_reflection_outcome.as_ref())) } }
            tr { th { "Last memory worker" } td { (outcome(v.last_worker_outcome.as_ref())) } }
            tr { th { "Failed worker instructions" } td {
                @if v.failed_workers.is_empty() { "none" }
                @for f in &v.failed_workers {
                    div { code { (f.id) } " after " (f.attempts) " runs: " (f.instruction) }
                }
            } }
        }
        h2 { "System prompt in use" }
        @if let Some(p) = &v.system_prompt {
            p.meta { "Compiled " (p.compiled_at) @if let Some(r) = &p.memfs_revision { " from " (short(r)) } }
            details { summary { "Show (" (p.content.chars().count()) " characters)" } pre { (p.content) } }
        } @else { p { "None cached yet (compiled at the next turn)." } }
        h2 { "Messages (" (v.messages.len()) ")" }
        @for m in &v.messages {
            div class={ "msg" @if m.evicted { " evicted" } @if m.kind.as_deref() == Some("summary") { " summary" } } {
                div.meta {
                    (m.role) " · " (m.id) " · " (m.ts)
                    @if m.kind.as_deref() == Some("summary") { span.badge { "summary" } }
                    @if m.evicted { span.badge { "evicted" } }
                }
                pre { (m.text) }
            }
        }
    };
    layout(page, &format!("{} {}", v.agent.name, v.id), body)
}

/// A sub-agent run's two parts, kept apart: what merged, how the task ended.
fn outcome(o: Option<&super::data::SubagentOutcome>) -> Markup {
    html! {
        @match o {
            None => "none",
            Some(o) => {
                "merge " (o.merge) ", task " (o.task)
                @if let Some(n) = o.attempt { " (run " (n) ")" }
                " at " (o.finished_at)
                @if !o.summary.is_empty() { div.meta { (o.summary) } }
            }
        }
    }
}

pub fn search(
    page: &Page,
    agent: &AgentRecord,
    query: &str,
    hits: &[crate::recall::search::Hit],
) -> String {
    let base = page.agent_base(&agent.id);
    let body = html! {
        h1 { (agent.name) " — search" }
        (agent_nav(page, agent))
        @if page.served {
            form method="get" action="search.html" {
                input type="search" name="q" value=(query) placeholder="search every message";
                " " button type="submit" { "Search" }
            }
            @if !query.is_empty() {
                p.meta { (hits.len()) " result(s)" }
                @for h in hits {
                    div.msg {
                        div.meta {
                            a href={ (base) "c/" (url_path(&h.conversation_id)) ".html" } { (h.conversation_id) }
                            " · " (h.message_id) " · " (h.created_at) " · score " (format!("{:.2}", h.score))
                            @if h.evicted { span.badge { "evicted" } }
                        }
                        pre { (h.snippet) }
                    }
                }
            }
        } @else {
            p { "Search needs a running Palace: " code { "mini-letta palace serve" } "." }
        }
    };
    layout(page, &format!("{} search", agent.name), body)
}

/// An error page (status and message), escaped like everything else.
pub fn error(status: u16, message: &str) -> String {
    let page = Page::at_depth(0, true);
    let body = html! { h1 { (status) } p { (message) } p { a href="/index.html" { "Agents" } } };
    layout(&page, &status.to_string(), body)
}

/// The site's pages for one agent, as `(relative path, html)`: what
/// `export` writes. File pages are `HEAD`'s; commit pages cover the
/// history page's commits.
pub(crate) fn agent_site(
    site: &Site,
    id: &str,
) -> Result<Vec<(String, String)>, super::PalaceError> {
    let mut out = Vec::new();
    let dir = format!("a/{id}/");
    let at = |depth: usize| Page::at_depth(depth, site.served);
    let mem = site.memory(id)?;
    out.push((format!("{dir}index.html"), memory(&at(2), &mem)));
    for f in &mem.files {
        if super::check_memory_path(&f.path).is_err() {
            continue;
        }
        let view = match site.file(id, &f.path, None) {
            Ok(v) => v,
            Err(super::PalaceError::NotFound(_)) => continue,
            Err(e) => return Err(e),
        };
        let depth = 3 + f.path.matches('/').count();
        out.push((
            format!("{dir}files/{}.html", f.path),
            file(&at(depth), &view),
        ));
    }
    let hist = site.history(id)?;
    out.push((format!("{dir}history.html"), history(&at(2), &hist)));
    for c in &hist.commits {
        let oid = super::check_sha(&c.sha)?;
        out.push((
            format!("{dir}commits/{}.html", c.sha),
            commit(&at(3), &site.commit(id, oid)?),
        ));
    }
    for c in &mem.conversations {
        out.push((
            format!("{dir}c/{}.html", c.id),
            conversation(&at(3), &site.conversation(id, &c.id)?),
        ));
    }
    out.push((
        format!("{dir}search.html"),
        search(&at(2), &mem.agent, "", &[]),
    ));
    Ok(out)
}
