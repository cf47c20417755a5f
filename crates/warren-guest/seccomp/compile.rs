// The compiler of the agent's system-call policy, `include!`d by `build.rs` (which reads
// `seccomp/agent.json` and writes the program) and by the fuzz target `seccomp_policy`
// (fuzz/fuzz_targets/seccomp_policy.rs). What a policy it refuses gets is an `Err`; a panic
// is a bug of this compiler (or of seccompiler): a program unlike seccompiler's own chain.
//
// It needs `serde_json` and `seccompiler` (with its `json` feature).

use serde_json::{Value, json};

/// `SECCOMP_RET_TRACE` and the marker `agent.json` uses for "tell the guest".
const RET_TRACE: u32 = 0x7ff0_0000;
const NOTIFY_MARKER: u32 = 0x5741;
/// `SECCOMP_RET_USER_NOTIF`, `SECCOMP_RET_ERRNO`, `SECCOMP_RET_ALLOW`.
const RET_USER_NOTIF: u32 = 0x7fc0_0000;
const RET_ERRNO: u32 = 0x0005_0000;
const RET_ALLOW: u32 = 0x7fff_0000;
const ENOSYS: u32 = 38;

/// The highest system-call number the policy was reviewed against (seccompiler's table:
/// `mseal`); newer ones answer ENOSYS, so programs fall back instead of failing on EPERM.
const LAST_REVIEWED: u32 = 462;
/// Where the x32 numbers start (`__X32_SYSCALL_BIT`).
const X32_BIT: u32 = 0x4000_0000;

/// BPF opcodes used to build the dispatch.
const RET_K: u16 = 0x06;
const JA: u16 = 0x05;
const JEQ_K: u16 = 0x15;
const JGE_K: u16 = 0x35;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Insn {
    code: u16,
    jt: u8,
    jf: u8,
    k: u32,
}

impl From<&seccompiler::sock_filter> for Insn {
    fn from(i: &seccompiler::sock_filter) -> Insn {
        Insn {
            code: i.code,
            jt: i.jt,
            jf: i.jf,
            k: i.k,
        }
    }
}

/// Compiles the text of a policy (`agent.json`'s format) for `target` into one program, checked
/// against seccompiler's chain over every call number. Err: not a policy this compiler takes
/// (not JSON, refused by seccompiler, or unlike what `agent.json` must be: the agent filter's
/// default the notify marker, the enosys filter answering ENOSYS, for calls without arguments).
fn compile_policy(text: &[u8], target: seccompiler::TargetArch) -> Result<Vec<Insn>, String> {
    let policy: Value = serde_json::from_slice(text).map_err(|e| format!("not JSON: {e}"))?;
    let try_compile = |json: &Value| -> Result<Vec<Insn>, String> {
        let filters = seccompiler::compile_from_json(json.to_string().as_bytes(), target)
            .map_err(|e| e.to_string())?;
        if filters.len() != 1 {
            return Err(format!("{} filters", filters.len()));
        }
        let (_, prog) = filters.into_iter().next().ok_or("no filter")?;
        Ok(prog.iter().map(Insn::from).collect())
    };
    let agent = try_compile(&json!({ "agent": policy["agent"] }))?;
    if !agent
        .iter()
        .any(|i| i.code == RET_K && i.k == RET_TRACE | NOTIFY_MARKER)
    {
        return Err("the agent filter's default action must be the notify marker".into());
    }
    let enosys = try_compile(&json!({ "enosys": policy["enosys"] }))?;
    if policy["enosys"]["filter_action"] != json!({ "errno": ENOSYS }) {
        return Err("the enosys filter must answer ENOSYS".into());
    }
    let args = |section: &Value| -> bool {
        section["filter"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|r| r.get("args").is_some())
    };
    if args(&policy["enosys"]) {
        return Err("the enosys filter takes no arguments".into());
    }
    // Each call alone compiles as it does in the whole section (seccompiler accepted that).
    let compile = |json: &Value| -> Vec<Insn> {
        try_compile(json).unwrap_or_else(|e| panic!("one call of the policy does not compile: {e}"))
    };
    let reference = Reference {
        agent: rewrite_marker(agent),
        enosys,
    };
    let prog = tree::build(&policy, &reference, &compile);
    verify::equivalent(&prog, &reference, &policy);
    Ok(prog)
}

/// seccompiler's programs for the whole policy, the ones the generated program must match.
struct Reference {
    /// The allowlist, its marker rewritten to `SECCOMP_RET_USER_NOTIF`.
    agent: Vec<Insn>,
    /// The system calls that must look absent.
    enosys: Vec<Insn>,
}

/// Rewrites every `RET trace|marker` of a seccompiler program to `RET user_notif`.
fn rewrite_marker(mut prog: Vec<Insn>) -> Vec<Insn> {
    let mut marked = 0;
    for insn in &mut prog {
        if insn.code == RET_K && insn.k == RET_TRACE | NOTIFY_MARKER {
            insn.k = RET_USER_NOTIF;
            marked += 1;
        }
    }
    assert!(
        marked > 0,
        "the agent filter's default action must be the notify marker"
    );
    prog
}

/// The dispatch: a binary search over ranges of system-call numbers, each range ending in its
/// action (allow, ENOSYS, the default notification) or in a jump to one call's argument checks.
mod tree {
    use super::*;

    /// What a range of call numbers gets.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Action {
        Ret(u32),
        /// The argument checks of block `i`.
        Block(usize),
    }

    /// An instruction whose jump target is a label, resolved once the layout is known.
    enum Item {
        Insn(Insn),
        /// `JGE k`: true falls through to a `JA` to `right`, false skips it.
        Split {
            k: u32,
            right: usize,
        },
        Jump(usize),
        Label(usize),
    }

    /// seccompiler's program for one system call's rules (arch check, load of the number,
    /// `JEQ nr`, its argument checks, the default), split into the number and the part from the
    /// `JEQ` on (self-contained: every jump in it lands in it).
    fn one_call(
        name: &str,
        rules: &[Value],
        section: &Value,
        reference: &[Insn],
        compile: &dyn Fn(&Value) -> Vec<Insn>,
    ) -> (u32, Vec<Insn>) {
        let mut one = section.clone();
        one["filter"] = Value::Array(rules.to_vec());
        let prog = compile(&json!({ "one": one }));
        assert!(
            prog.len() > 5 && prog[..4] == reference[..4],
            "{name}: seccompiler's program does not start as expected (arch check, load nr)"
        );
        assert_eq!(prog[4].code, JEQ_K, "{name}: no JEQ on the call number");
        (prog[4].k, prog[4..].to_vec())
    }

    /// Rules grouped by system call, in the policy's order.
    fn by_call(section: &Value) -> Vec<(String, Vec<Value>)> {
        let mut groups: Vec<(String, Vec<Value>)> = Vec::new();
        for rule in section["filter"].as_array().expect("a filter list") {
            let name = rule["syscall"]
                .as_str()
                .expect("a syscall name")
                .to_string();
            match groups.iter_mut().find(|(n, _)| *n == name) {
                Some((_, rules)) => rules.push(rule.clone()),
                None => groups.push((name, vec![rule.clone()])),
            }
        }
        groups
    }

    pub fn build(
        policy: &Value,
        reference: &Reference,
        compile: &dyn Fn(&Value) -> Vec<Insn>,
    ) -> Vec<Insn> {
        let agent = &policy["agent"];
        let default = *reference.agent.last().expect("a program");
        assert!(default.code == RET_K && default.k == RET_USER_NOTIF);
        // Each call number's action, 0..=LAST_REVIEWED (the policy knows no other number).
        let mut actions = vec![Action::Ret(RET_USER_NOTIF); LAST_REVIEWED as usize + 1];
        let mut blocks: Vec<Vec<Insn>> = Vec::new();
        for (name, rules) in by_call(agent) {
            let (nr, block) = one_call(&name, &rules, agent, &reference.agent, compile);
            assert!(
                nr <= LAST_REVIEWED,
                "{name} ({nr}) is newer than the review"
            );
            let unconditional = rules.iter().any(|r| r.get("args").is_none());
            actions[nr as usize] = if unconditional {
                Action::Ret(RET_ALLOW)
            } else {
                let block = rewrite_marker(block);
                blocks.push(block);
                Action::Block(blocks.len() - 1)
            };
        }
        let enosys = &policy["enosys"];
        assert_eq!(
            enosys["filter_action"],
            json!({ "errno": ENOSYS }),
            "the enosys filter answers ENOSYS"
        );
        for (name, rules) in by_call(enosys) {
            assert!(
                rules.iter().all(|r| r.get("args").is_none()),
                "{name}: the enosys filter takes no arguments"
            );
            let (nr, _) = one_call(&name, &rules, enosys, &reference.enosys, compile);
            // ERRNO outranks both allow and notify: the call looks absent whatever the
            // allowlist says.
            actions[nr as usize] = Action::Ret(RET_ERRNO | ENOSYS);
        }
        // Ranges: each number up to the review, newer ones (ENOSYS), then the x32 numbers
        // (the default, as in seccompiler's chain).
        let mut ranges: Vec<(u32, Action)> = Vec::new();
        let mut push = |start: u32, a: Action| {
            if ranges.last().map(|&(_, last)| last) != Some(a) {
                ranges.push((start, a));
            }
        };
        for (nr, a) in actions.iter().enumerate() {
            push(nr as u32, *a);
        }
        push(LAST_REVIEWED + 1, Action::Ret(RET_ERRNO | ENOSYS));
        push(X32_BIT, Action::Ret(RET_USER_NOTIF));

        let mut items: Vec<Item> = reference.agent[..4]
            .iter()
            .map(|&i| Item::Insn(i))
            .collect();
        let mut labels = 0usize;
        let block_labels: Vec<usize> = (0..blocks.len()).map(|i| i + 1_000_000).collect();
        search(&ranges, &mut items, &mut labels, &block_labels);
        for (i, block) in blocks.iter().enumerate() {
            items.push(Item::Label(block_labels[i]));
            items.extend(block.iter().map(|&i| Item::Insn(i)));
        }
        layout(items)
    }

    /// Emits the search over `ranges` (sorted by start; the first covers everything below the
    /// second's start).
    fn search(
        ranges: &[(u32, Action)],
        items: &mut Vec<Item>,
        labels: &mut usize,
        block_labels: &[usize],
    ) {
        if let [(_, action)] = ranges {
            items.push(match *action {
                Action::Ret(k) => Item::Insn(Insn {
                    code: RET_K,
                    jt: 0,
                    jf: 0,
                    k,
                }),
                Action::Block(i) => Item::Jump(block_labels[i]),
            });
            return;
        }
        let mid = ranges.len() / 2;
        *labels += 1;
        let right = *labels;
        items.push(Item::Split {
            k: ranges[mid].0,
            right,
        });
        search(&ranges[..mid], items, labels, block_labels);
        items.push(Item::Label(right));
        search(&ranges[mid..], items, labels, block_labels);
    }

    /// Places the items and resolves their labels.
    fn layout(items: Vec<Item>) -> Vec<Insn> {
        let mut at = std::collections::HashMap::new();
        let mut pc = 0usize;
        for item in &items {
            match item {
                Item::Label(l) => {
                    at.insert(*l, pc);
                }
                Item::Split { .. } => pc += 2,
                _ => pc += 1,
            }
        }
        let mut prog = Vec::with_capacity(pc);
        let ja = |from: usize, to: usize| Insn {
            code: JA,
            jt: 0,
            jf: 0,
            k: u32::try_from(to.checked_sub(from + 1).expect("jumps go forward")).unwrap(),
        };
        for item in items {
            match item {
                Item::Label(_) => {}
                Item::Insn(i) => prog.push(i),
                Item::Split { k, right } => {
                    prog.push(Insn {
                        code: JGE_K,
                        jt: 0,
                        jf: 1,
                        k,
                    });
                    let from = prog.len();
                    prog.push(ja(from, at[&right]));
                }
                Item::Jump(l) => {
                    let from = prog.len();
                    prog.push(ja(from, at[&l]));
                }
            }
        }
        assert!(prog.len() <= u16::MAX as usize);
        prog
    }
}

/// The generated program against seccompiler's: every call number (both architectures'
/// ranges), and for calls with argument checks, each checked value, its neighbours, every bit
/// and pseudo-random words, in every argument slot.
mod verify {
    use super::*;

    /// `seccomp_data`: nr, arch, instruction pointer, six arguments.
    fn data(nr: u32, arch: u32, args: &[u64; 6]) -> [u8; 64] {
        let mut d = [0u8; 64];
        d[0..4].copy_from_slice(&nr.to_ne_bytes());
        d[4..8].copy_from_slice(&arch.to_ne_bytes());
        for (i, a) in args.iter().enumerate() {
            d[16 + 8 * i..24 + 8 * i].copy_from_slice(&a.to_ne_bytes());
        }
        d
    }

    /// A classic-BPF interpreter for what seccomp filters use. Panics on anything else, and
    /// on a program that runs off its end.
    pub fn run(prog: &[Insn], d: &[u8; 64]) -> u32 {
        let (mut a, mut x, mut mem) = (0u32, 0u32, [0u32; 16]);
        let mut pc = 0usize;
        loop {
            let i = prog[pc];
            pc += 1;
            let word = |k: u32| {
                let k = k as usize;
                u32::from_ne_bytes(d[k..k + 4].try_into().unwrap())
            };
            match i.code {
                0x20 => a = word(i.k),         // LD W ABS
                0x00 => a = i.k,               // LD IMM
                0x01 => x = i.k,               // LDX IMM
                0x60 => a = mem[i.k as usize], // LD MEM
                0x61 => x = mem[i.k as usize], // LDX MEM
                0x02 => mem[i.k as usize] = a, // ST
                0x03 => mem[i.k as usize] = x, // STX
                0x54 => a &= i.k,              // ALU AND K
                0x44 => a |= i.k,              // ALU OR K
                0x74 => a >>= i.k,             // ALU RSH K
                0x64 => a <<= i.k,             // ALU LSH K
                0x07 => x = a,                 // TAX
                0x87 => a = x,                 // TXA
                0x06 => return i.k,            // RET K
                0x16 => return a,              // RET A
                0x05 => pc += i.k as usize,    // JA
                0x15 | 0x25 | 0x35 | 0x45 | 0x1d | 0x2d | 0x3d | 0x4d => {
                    let v = if i.code & 0x08 != 0 { x } else { i.k };
                    let t = match i.code & 0xf0 {
                        0x10 => a == v,
                        0x20 => a > v,
                        0x30 => a >= v,
                        _ => a & v != 0,
                    };
                    pc += if t { i.jt } else { i.jf } as usize;
                }
                c => panic!("the interpreter does not know opcode {c:#x}"),
            }
        }
    }

    /// The kernel's choice among stacked filters' answers: the lowest action as a signed value
    /// (kill first, allow last).
    fn stacked(answers: &[u32]) -> u32 {
        *answers
            .iter()
            .min_by_key(|&&r| (r & 0xffff_0000) as i32)
            .unwrap()
    }

    /// What the three filters the guest installed before gave (seccompiler's agent chain,
    /// seccompiler's enosys chain, and ENOSYS above the review).
    fn reference(r: &Reference, d: &[u8; 64], nr: u32, arch: u32, native: u32) -> u32 {
        let above = if arch == native && nr > LAST_REVIEWED && nr < X32_BIT {
            RET_ERRNO | ENOSYS
        } else {
            RET_ALLOW
        };
        stacked(&[run(&r.agent, d), run(&r.enosys, d), above])
    }

    pub fn equivalent(prog: &[Insn], r: &Reference, policy: &Value) {
        let native = r.agent[1].k;
        assert_eq!(
            r.agent[1].code, JEQ_K,
            "the agent program starts with its arch check"
        );
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        // Values worth trying in an argument: those the rules name, their neighbours and
        // masks, every single bit, the extremes.
        let mut values: Vec<u64> = vec![0, 1, u64::MAX, u32::MAX as u64, 1 << 32];
        for rule in policy["agent"]["filter"].as_array().unwrap() {
            for arg in rule["args"].as_array().into_iter().flatten() {
                let val = arg["val"].as_u64().unwrap_or(0);
                let mask = arg["op"]["masked_eq"].as_u64().unwrap_or(0);
                for v in [val, mask, val | mask, !mask, val ^ mask] {
                    values.extend([v, v.wrapping_add(1), v.wrapping_sub(1)]);
                    values.extend([v | 0xffff_ffff_0000_0000, v & 0xffff_ffff]);
                }
            }
        }
        values.extend((0..64).map(|b| 1u64 << b));
        values.sort_unstable();
        values.dedup();
        let mut nrs: Vec<u32> = (0..=LAST_REVIEWED + 64).collect();
        nrs.extend((X32_BIT - 4..X32_BIT + LAST_REVIEWED + 64).collect::<Vec<_>>());
        nrs.extend([
            u32::MAX,
            u32::MAX - 1,
            0x7fff_ffff,
            0x8000_0000,
            0x1000_0000,
        ]);
        let mut checked = 0u64;
        for arch in [native, 0x4000_0003, 0, u32::MAX] {
            for &nr in &nrs {
                let mut cases: Vec<[u64; 6]> = vec![[0; 6], [u64::MAX; 6]];
                if arch == native && nr <= LAST_REVIEWED {
                    for &v in &values {
                        for slot in 0..6 {
                            let mut args = [0u64; 6];
                            args[slot] = v;
                            cases.push(args);
                        }
                    }
                    for _ in 0..64 {
                        let mut args = [0u64; 6];
                        for a in &mut args {
                            *a = match next() % 3 {
                                0 => values[(next() % values.len() as u64) as usize],
                                1 => next() & 0xffff_ffff,
                                _ => next(),
                            };
                        }
                        cases.push(args);
                    }
                }
                for args in &cases {
                    let d = data(nr, arch, args);
                    let (got, want) = (run(prog, &d), reference(r, &d, nr, arch, native));
                    assert_eq!(
                        got, want,
                        "the generated filter answers {got:#x}, seccompiler's {want:#x}, for \
                         call {nr} arch {arch:#x} args {args:x?}"
                    );
                    checked += 1;
                }
            }
        }
        assert!(checked > 100_000, "only {checked} cases were checked");
    }
}
