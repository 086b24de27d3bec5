//! Recall at scale: 100,000 and 1,000,000 generated messages (about 70 %
//! English, 30 % Chinese, realistic lengths) over 100 conversations.
//! Measures the index build (from nothing), reopening it, the cost of
//! indexing one appended message, median and p99 query time for 1-term,
//! 3-term and phrase queries, the index size on disk, and a plain scan of
//! the same messages (texts already in memory and normalised: a generous
//! baseline) in the same run: terms as substrings, a phrase with the same
//! check the index applies (`phrase_count`: word boundaries, collapsed
//! whitespace). Phrases are two or three adjacent words of a message, or
//! two or three adjacent Chinese characters.
//!
//! Then the whole CLI call, as a user runs it: `recall reindex` once
//! (wall time and peak RSS) and `recall search` as a child process, median
//! wall time and peak RSS over several queries and rounds (RSS by
//! `/usr/bin/time`, whose wall time is in the figure too). The binary is
//! `$MINI_LETTA_BIN` (default: this build's); with `$MINI_LETTA_BASE_BIN`
//! set too, both are timed alternately, each on its own copy of the home
//! (either may rebuild an index of the other's format), with the median
//! of the per-pair ratios.
//!
//! Run: `cargo bench --bench recall` (or `scripts/bench-recall`);
//! `--quick` for 100,000 messages only.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use mini_letta::paths::{AgentPaths, Home};
use mini_letta::protocol::messages::{Part, Role};
use mini_letta::recall::query::phrase_count;
use mini_letta::recall::tokenize::normalize;
use mini_letta::recall::{Filters, Index, Query};
use mini_letta::store::conversation::StoredMessage;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const CONVERSATIONS: usize = 100;
const QUERIES: usize = 300;
const SCAN_QUERIES: usize = 20;
const LIMIT: usize = 10;
/// Rounds of CLI searches (each runs every query once per binary).
const CLI_ROUNDS: usize = 6;

const COMMON: &[&str] = &[
    "the",
    "a",
    "to",
    "and",
    "of",
    "is",
    "in",
    "it",
    "you",
    "that",
    "i",
    "for",
    "on",
    "we",
    "this",
    "with",
    "can",
    "be",
    "my",
    "memory",
    "agent",
    "file",
    "please",
    "should",
    "will",
    "deploy",
    "server",
    "test",
    "build",
    "error",
    "fix",
    "update",
    "meeting",
    "tomorrow",
    "project",
    "release",
    "config",
    "database",
    "query",
    "index",
    "user",
    "note",
    "remember",
    "green",
    "tea",
    "coffee",
    "kettle",
    "lighthouse",
    "invoice",
    "customer",
    "report",
    "rust",
];
const HAN: &str = "的一是不了在人有我他这个们中来上大为和国地到以说时要就出会可也你对生能而子那得于着下自之年过发后作里用道行所然家种事成方多经么去法学如都同现当没动面起看定天分还进好小部其些主样理心她本前开但因只从想实日军者意无力它与长把机十民第公此已工使情明性知全三又关点正业外将两高间由问很最重并物手应战向头文体政美相见被利什二等产或新己制身果加西斯月话合回特代内信表化老给世位次度门任常先海通教儿原东声提立及比员解水名真论处走义各入几口认条平系气题活尔更别打女变四神总何电数安少报才结反受目太量再感建务做接必场件计管期市直德资命山金指克许统区保至队形社便空决治展马科司五基眼书非则听白却界达光放强即像难且权思王象完设式色路记南品住告类求据程北边死张该交规万取拉格望觉术领共确传师观清今切院让识候带导争运笑飞风步改收根干造言联持组每济车亲极林服快办议往元英士证近失转夫令准布始怎呢存未远叫台单影具罗字爱击流备兵连调深商算质团集百需价花党华城石级整府离况亚请技际约示复病息究线似官火断精满支视消越器容照须九增研写称企八功吗包片史委乎查轻易早曾除农找装广显吧阿李标谈吃图念六引历首医局突专费号尽另周较注语仅考落青随选列武红响虽推势参希古众构房半节土投某案黑维革划敌致陈律足态护七兴派孩验责营星够章音跟志底站严巴例防族供效续施留讲型料终答紧黄绝奇察母京段依批群项故按河米围江织害斗双境客纪采举杀攻父苏密低朝友诉止细愿千值仍男钱破网热助倒育属坐帝限船脸职速刻乐否刚威毛状率甚独球般普怕弹校苦创假久错承印晚兰试股拿脑预谁益阳若哪微尼继送急血惊伤素药适波夜省初喜卫源食险待述陆习置居劳财环排福纳欢雷警获模充负云停木游龙树疑层冷洲冲射略范竟句室异激汉村哈策演简卡罪判担州静退既衣您宗积余痛检差富灵协角占配征修皮挥胜降阶审沉坚善妈刘读啊超免压银买皇养伊怀执副乱抗犯追帮宣佛岁航优怪香著田铁控税左右份穿艺背阵草脚概恶块顿敢守酒岛托央户烈洋哥索胡款靠评版宝座释景顾弟登货互付伯慢欧换闻危忙核暗姐介坏讨丽良序升监临亮露永呼味野架域沙掉括舰鱼杂误湾吉减编楚肯测败屋跑梦散温困剑渐封救贵枪缺楼县尚毫移娘朋画班智亦耳恩短掌恐遗固席松秘谢鲁遇康虑幸均销钟诗藏赶剧票损忽巨炮旧端探湖录叶春乡附吸予礼港雨呀板庭妇归睛饭额含顺输摇招婚脱补谓督毒油疗旅泽材灭逐莫笔亡鲜词圣择寻厂睡博勒烟授诺伦岸奥唐卖俄炸载洛健堂旁宫喝借君禁阴园谋宋避抓荣姑孙逃牙束跳顶玉镇雪午练迫爷篇肉嘴馆遍凡础洞卷坦牛宁纸诸训私庄祖丝翻暴森塔默握戏隐熟骨访弱蒙歌店鬼软典欲萨伙遭盘爸扩盖弄雄稳忘亿刺拥徒姆杨齐赛趣曲刀床迎冰虚玩析窗醒妻透购替塞努休虎扬途侵刑绿兄迅套贸毕唯谷轮库迹尤竞街促延震弃甲伟麻川申缓潜闪售灯针哲络抵朱埃抱鼓植纯夏忍页杰筑折郑贝尊吴秀混臣雅振染盛怒舞圆搞狂措姓残秋培迷诚宽宇猛摆梅毁伸摩盟末乃悲拍丁赵";

/// A deterministic corpus: `n` message texts over `CONVERSATIONS`.
struct Corpus {
    words: Vec<String>,
    han: Vec<char>,
    rng: StdRng,
}

impl Corpus {
    fn new() -> Self {
        let mut rng = StdRng::seed_from_u64(16);
        let syll = [
            "ka", "to", "ri", "ne", "sa", "mo", "lu", "pe", "di", "an", "or", "el", "ix", "um",
            "ba",
        ];
        let mut words: Vec<String> = COMMON.iter().map(|s| s.to_string()).collect();
        while words.len() < 20_000 {
            let n = rng.random_range(2..5);
            let w: String = (0..n)
                .map(|_| syll[rng.random_range(0..syll.len())])
                .collect();
            words.push(w);
        }
        Self {
            words,
            han: HAN.chars().collect(),
            rng,
        }
    }

    /// A Zipf-like rank in `0..n` (log-uniform).
    fn rank(&mut self, n: usize) -> usize {
        let u: f64 = self.rng.random();
        (((n as f64 + 1.0).powf(u)) as usize)
            .saturating_sub(1)
            .min(n - 1)
    }

    fn text(&mut self) -> String {
        if self.rng.random_bool(0.7) {
            let len = 3 + self.rank(120);
            let mut s = String::new();
            for i in 0..len {
                if i > 0 {
                    s.push(' ');
                }
                let r = self.rank(self.words.len());
                s.push_str(&self.words[r]);
                if self.rng.random_bool(0.08) {
                    s.push('.');
                }
            }
            s
        } else {
            let len = 5 + self.rank(160);
            let mut s = String::new();
            for _ in 0..len {
                let r = self.rank(self.han.len());
                s.push(self.han[r]);
                if self.rng.random_bool(0.06) {
                    s.push('，');
                }
            }
            s.push('。');
            s
        }
    }
}

fn line(id: usize, text: &str) -> Vec<u8> {
    let mut m = StoredMessage::new(
        format!("msg-{id:06}"),
        if id.is_multiple_of(2) {
            Role::User
        } else {
            Role::Assistant
        },
        vec![Part::Text { text: text.into() }],
    );
    m.ts = format!("2026-{:02}-{:02}T10:00:00Z", 1 + id % 12, 1 + id % 28);
    let mut l = serde_json::to_vec(&m).unwrap();
    l.push(b'\n');
    l
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn mb(b: u64) -> f64 {
    b as f64 / (1 << 20) as f64
}

fn run(n: usize) {
    println!("\n== {n} messages ==");
    let tmp = tempfile::tempdir().unwrap();
    let id = create_agent(&new_bin(), tmp.path());
    let agent = Home::at(tmp.path()).agent(&id).unwrap();
    let mut corpus = Corpus::new();
    let mut texts: Vec<String> = Vec::with_capacity(n);
    let mut bytes = 0u64;
    let convs = agent.conversations_dir();
    let mut files: Vec<std::io::BufWriter<std::fs::File>> = (0..CONVERSATIONS)
        .map(|c| {
            let d = convs.join(format!("c{c:03}"));
            std::fs::create_dir_all(&d).unwrap();
            std::io::BufWriter::new(std::fs::File::create(d.join("messages.jsonl")).unwrap())
        })
        .collect();
    let per = n / CONVERSATIONS;
    for i in 0..n {
        let t = corpus.text();
        let l = line(i % per + 1, &t);
        bytes += l.len() as u64;
        files[i / per].write_all(&l).unwrap();
        texts.push(normalize(&t));
    }
    drop(files);
    println!(
        "messages.jsonl: {:.1} MB in {CONVERSATIONS} conversations",
        mb(bytes)
    );

    let t = Instant::now();
    let index = Index::open(&agent).unwrap();
    let build = t.elapsed().as_secs_f64();
    assert_eq!(index.len(), n);
    let size = index.disk_size();
    drop(index);
    // Opening an existing index (load + catch-up check): the cost of a
    // one-shot `recall search`. Best of three, so one page-cache miss
    // does not decide it.
    let mut reopen = f64::MAX;
    let mut reopen_ro = f64::MAX;
    for _ in 0..3 {
        let t = Instant::now();
        drop(Index::open(&agent).unwrap());
        reopen = reopen.min(t.elapsed().as_secs_f64());
        let t = Instant::now();
        let ro = Index::open_read_only(&agent).unwrap();
        reopen_ro = reopen_ro.min(t.elapsed().as_secs_f64());
        assert_eq!(ro.len(), n);
    }
    let mut index = Index::open(&agent).unwrap();
    println!(
        "build: {build:.2} s ({:.1} µs/message); open: {:.1} ms (read-only: {:.1} ms)",
        build * 1e6 / n as f64,
        reopen * 1e3,
        reopen_ro * 1e3
    );
    println!(
        "index on disk: {:.1} MB = {:.2}× the messages",
        mb(size),
        size as f64 / bytes as f64
    );

    // Appends: a line written to a log, then that conversation caught up.
    let appends = 2000;
    let path = convs.join("c000").join("messages.jsonl");
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap();
    let mut spent = 0.0;
    for i in 0..appends {
        let t = corpus.text();
        f.write_all(&line(per + 1 + i, &t)).unwrap();
        let s = Instant::now();
        index.catch_up_conversation("c000").unwrap();
        spent += s.elapsed().as_secs_f64();
    }
    assert_eq!(index.len(), n + appends);
    println!(
        "append: {:.1} µs per message (indexing one appended message)",
        spent * 1e6 / appends as f64
    );

    // Queries.
    let mut rng = StdRng::seed_from_u64(7);
    let word = |rng: &mut StdRng, c: &Corpus| -> String {
        if rng.random_bool(0.7) {
            c.words[rng.random_range(0..2000)].clone()
        } else {
            let a = c.han[rng.random_range(0..c.han.len())];
            let b = c.han[rng.random_range(0..c.han.len())];
            if rng.random_bool(0.5) {
                format!("{a}")
            } else {
                format!("{a}{b}")
            }
        }
    };
    // Two or three adjacent words of a message (within a sentence), or
    // two or three adjacent Chinese characters (within a clause).
    let phrase = |rng: &mut StdRng| -> String {
        loop {
            let t = &texts[rng.random_range(0..n)];
            let k = rng.random_range(2..=3);
            let runs: Vec<Vec<&str>> = if t.is_ascii() {
                t.split('.')
                    .map(|s| s.split_whitespace().collect())
                    .collect()
            } else {
                t.split([',', '。'])
                    .map(|s| {
                        s.char_indices()
                            .map(|(i, c)| &s[i..i + c.len_utf8()])
                            .collect()
                    })
                    .collect()
            };
            let runs: Vec<&Vec<&str>> = runs.iter().filter(|r| r.len() >= k).collect();
            if runs.is_empty() {
                continue;
            }
            let r = runs[rng.random_range(0..runs.len())];
            let i = rng.random_range(0..=r.len() - k);
            let sep = if t.is_ascii() { " " } else { "" };
            return format!("\"{}\"", r[i..i + k].join(sep));
        }
    };
    let kinds: Vec<(&str, Vec<String>)> = vec![
        (
            "1-term",
            (0..QUERIES).map(|_| word(&mut rng, &corpus)).collect(),
        ),
        (
            "3-term",
            (0..QUERIES)
                .map(|_| {
                    format!(
                        "{} {} {}",
                        word(&mut rng, &corpus),
                        word(&mut rng, &corpus),
                        word(&mut rng, &corpus)
                    )
                })
                .collect(),
        ),
        ("phrase", (0..QUERIES).map(|_| phrase(&mut rng)).collect()),
    ];
    let filters = Filters::default();
    println!(
        "{:<8} {:>12} {:>12} {:>12} {:>10}",
        "query", "median ms", "p99 ms", "scan ms", "speed-up"
    );
    for (kind, queries) in &kinds {
        let mut times = Vec::new();
        let mut found = 0;
        for q in queries {
            let t = Instant::now();
            let parsed = Query::parse(q);
            let hits = index.search(&parsed, &filters, LIMIT).unwrap();
            times.push(t.elapsed().as_secs_f64() * 1e3);
            found += usize::from(!hits.is_empty());
        }
        // The scan: every message's lower-cased text, every term a substring.
        let mut scan = Vec::new();
        for q in queries.iter().take(SCAN_QUERIES) {
            let phrase = q.starts_with('"').then(|| q.trim_matches('"').to_string());
            let terms: Vec<String> = q.split_whitespace().map(str::to_string).collect();
            let t = Instant::now();
            let mut hits: Vec<(usize, usize)> = texts
                .iter()
                .enumerate()
                .filter_map(|(i, s)| {
                    let k = match &phrase {
                        Some(p) => phrase_count(s, p),
                        None => terms.iter().filter(|t| s.contains(t.as_str())).count(),
                    };
                    (k > 0).then_some((k, i))
                })
                .collect();
            hits.sort_by(|a, b| b.cmp(a));
            hits.truncate(LIMIT);
            std::hint::black_box(&hits);
            scan.push(t.elapsed().as_secs_f64() * 1e3);
        }
        let med = pct(&mut times, 0.5);
        let p99 = pct(&mut times, 0.99);
        let scan_med = pct(&mut scan, 0.5);
        println!(
            "{kind:<8} {med:>12.3} {p99:>12.3} {scan_med:>12.1} {:>9.0}×   ({found}/{} found)",
            scan_med / med,
            queries.len()
        );
    }
    drop(index);
    cli(tmp.path(), &agent);
}

fn new_bin() -> String {
    support::bin().display().to_string()
}

/// `agent create bench` with `bin` in `home`; the agent's id.
fn create_agent(bin: &str, home: &Path) -> String {
    let o = Command::new(bin)
        .env("MINI_LETTA_HOME", home)
        .args(["agent", "create", "bench", "--json"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    v["id"].as_str().unwrap().to_string()
}

/// Run `bin` with `args` in `home`: wall seconds and peak RSS in bytes.
/// The RSS is `/usr/bin/time`'s: a child forked from this (large) process
/// would report this process's peak as its own.
fn timed(bin: &str, home: &Path, args: &[&str]) -> (f64, u64) {
    let out = std::env::temp_dir().join(format!("recall-bench-rss-{}", std::process::id()));
    let t = Instant::now();
    let status = Command::new("/usr/bin/time")
        .arg("-f")
        .arg("%M")
        .arg("-o")
        .arg(&out)
        .arg(bin)
        .args(args)
        .env("MINI_LETTA_HOME", home)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    let wall = t.elapsed().as_secs_f64();
    assert!(status.success(), "{args:?} failed");
    let kib: u64 = std::fs::read_to_string(&out)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    (wall, kib * 1024)
}

/// The whole CLI call on `home` (whose agent is `agent`).
fn cli(home: &Path, agent: &AgentPaths) {
    let mut bins = vec![("new", new_bin(), home.to_path_buf())];
    let base_home = tempfile::tempdir().unwrap();
    if let Ok(base) = std::env::var("MINI_LETTA_BASE_BIN") {
        // Its own copy of the conversations: an index of the other format
        // is rebuilt on open.
        let id = create_agent(&base, base_home.path());
        let to = Home::at(base_home.path())
            .agent(&id)
            .unwrap()
            .conversations_dir();
        for c in 0..CONVERSATIONS {
            let d = to.join(format!("c{c:03}"));
            std::fs::create_dir_all(&d).unwrap();
            let from = agent.conversations_dir().join(format!("c{c:03}"));
            std::fs::copy(from.join("messages.jsonl"), d.join("messages.jsonl")).unwrap();
        }
        bins.push(("base", base, base_home.path().to_path_buf()));
    }
    for (name, bin, home) in &bins {
        let (wall, rss) = timed(bin, home, &["recall", "reindex", "-a", "bench"]);
        println!(
            "cli {name}: recall reindex {wall:.2} s, peak {:.0} MiB",
            mb(rss)
        );
    }
    let queries = [
        "deploy server",
        "the",
        "memory agent tomorrow",
        "\"green tea\"",
        "绿茶",
    ];
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); bins.len()];
    let mut peak = vec![0u64; bins.len()];
    let mut ratios = Vec::new();
    for _round in 0..CLI_ROUNDS {
        for q in queries {
            let mut pair = Vec::new();
            for (i, (_, bin, home)) in bins.iter().enumerate() {
                let (wall, rss) = timed(bin, home, &["recall", "search", "-a", "bench", q]);
                times[i].push(wall * 1e3);
                peak[i] = peak[i].max(rss);
                pair.push(wall);
            }
            if let [a, b] = pair[..] {
                ratios.push(a / b);
            }
        }
    }
    for (i, (name, _, _)) in bins.iter().enumerate() {
        println!(
            "cli {name}: recall search median {:.1} ms, peak {:.1} MiB ({} calls)",
            pct(&mut times[i], 0.5),
            mb(peak[i]),
            times[i].len()
        );
    }
    if !ratios.is_empty() {
        println!(
            "cli new/base: median of per-pair ratios {:.3}",
            pct(&mut ratios, 0.5)
        );
    }
}

fn main() {
    support::say_binary();
    let quick = std::env::args().any(|a| a == "--quick");
    run(100_000);
    if !quick {
        run(1_000_000);
    }
}
