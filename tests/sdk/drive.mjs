// Drives mini-letta through letta-ai's own SDK (@letta-ai/letta-code-sdk),
// as a program written for letta-code would: LETTA_CLI_PATH names
// scripts/letta-code-cli.mjs. One scenario per run (argv[2]); prints one
// JSON document of what the SDK saw, for tests/sdk.rs to judge.
//   node drive.mjs SCENARIO   (env: MINI_LETTA_SDK = the unpacked package dir)
import { pathToFileURL } from "node:url";
import { join } from "node:path";

const sdk = await import(pathToFileURL(join(process.env.MINI_LETTA_SDK, "dist", "index.js")).href);
const out = {};

async function turn(session, text) {
  await session.send(text);
  const seen = [];
  let result = null;
  for await (const m of session.stream()) {
    if (m.type === "result") {
      result = m;
      break;
    }
    seen.push(m);
  }
  return { seen, result };
}

const scenario = process.argv[2];
try {
  if (scenario === "create-and-resume") {
    const agentId = await sdk.createAgent({ memfs: true, persona: "I am a careful archivist." });
    out.agentId = agentId;
    const s = sdk.resumeSession(agentId);
    const init = await s.initialize();
    out.init = { agentId: init.agentId, conversationId: init.conversationId, tools: init.tools, memfsEnabled: init.memfsEnabled };
    out.first = await turn(s, "remember: I live in Hangzhou");
    out.second = await turn(s, "where do I live?");
    s.close();
  } else if (scenario === "prompt") {
    const r = await sdk.prompt("hello there", process.argv[3]);
    out.result = r;
  } else if (scenario === "new-conversation") {
    const s = sdk.createSession(process.argv[3]);
    const init = await s.initialize();
    out.conversationId = init.conversationId;
    out.turn = await turn(s, "remember: my cat is called Mochi");
    s.close();
    const r = sdk.resumeSession(init.conversationId);
    const again = await r.initialize();
    out.resumedConversationId = again.conversationId;
    out.resumedAgentId = again.agentId;
    out.list = await r.listMessages({ limit: 10 });
    out.older = await r.listMessages({ limit: 2, before: out.list.messages[1]?.id });
    out.bootstrap = await r.bootstrapState({ limit: 5 });
    r.close();
  } else if (scenario === "abort") {
    const s = sdk.resumeSession(process.argv[3]);
    await s.initialize();
    await s.send("run: sleep 20");
    const seen = [];
    let result = null;
    const started = Date.now();
    for await (const m of s.stream()) {
      seen.push(m.type);
      if (m.type === "tool_call") await s.abort();
      if (m.type === "result") {
        result = m;
        break;
      }
    }
    out.seconds = (Date.now() - started) / 1000;
    out.seen = seen;
    out.result = result;
    out.list = await s.listMessages({ limit: 5 });
    out.after = await turn(s, "hello again");
    s.close();
  } else if (scenario === "unknown-agent") {
    const started = Date.now();
    const s = sdk.resumeSession("agent-00000000-0000-4000-8000-000000000000");
    try {
      await s.initialize();
      out.initialized = true;
    } catch (e) {
      out.error = String(e.message || e);
    }
    out.seconds = (Date.now() - started) / 1000;
    s.close();
  } else {
    throw new Error(`unknown scenario ${scenario}`);
  }
} catch (e) {
  out.thrown = String(e && e.stack ? e.stack : e);
}
process.stdout.write(JSON.stringify(out) + "\n");
process.exit(0);
