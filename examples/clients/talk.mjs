#!/usr/bin/env node
// Call a loopbus instance from Node, built-in modules only.
//
//     node talk.mjs ROOT TARGET [PROMPT]
//
// ROOT is the channel root (the parent of the instances' state directories), TARGET the
// instance to call; the prompt is read from stdin when PROMPT is absent. The caller's
// name is $LOOPBUS_INSTANCE (set for engines), else "script"; the depth is
// $LOOPBUS_DEPTH + 1. Prints the reply; exits 0, 1 (failure, not retryable), 75
// (retryable) or 2 (usage), like `loopbus talk`. The protocol is in PROTOCOL.md.
//
// node:http rather than fetch: fetch picks its connections itself, and the secret must
// go only on the connection whose health answer proved that the instance holds it.

import { createHmac, randomBytes, timingSafeEqual } from "node:crypto";
import { readFileSync } from "node:fs";
import http from "node:http";
import { join } from "node:path";

const PROBE_TIMEOUT_MS = 2_000; // connect and health answer
const TALK_TIMEOUT_MS = 1_800_000; // a turn may run long; loopbus talk's default
const BASE_CAPABILITIES = ["structured-errors", "retryable-errors"];

function fail(message, status) {
  process.stderr.write(`talk.mjs: ${message}\n`);
  process.exit(status);
}

// One request on `agent`; resolves to the status, the parsed body and the socket used.
// `check(socket)` runs before anything is written, and may refuse that socket.
function exchange(agent, options, body, timeoutMs, check = () => {}) {
  return new Promise((resolve, reject) => {
    const req = http.request({ ...options, agent }, (res) => {
      const socket = res.socket; // taken now: it is detached once the body has ended
      const chunks = [];
      res.on("data", (chunk) => chunks.push(chunk));
      res.on("end", () => {
        try {
          resolve({ status: res.statusCode, json: JSON.parse(Buffer.concat(chunks)), socket });
        } catch (e) {
          reject(e);
        }
      });
    });
    req.setTimeout(timeoutMs, () => req.destroy(new Error("timed out")));
    req.on("error", reject);
    req.on("socket", (socket) => {
      try {
        check(socket);
        req.end(body);
      } catch (e) {
        req.destroy(e);
      }
    });
  });
}

async function main() {
  const args = process.argv.slice(2);
  if (args.length < 2 || args.length > 3) fail("usage: talk.mjs ROOT TARGET [PROMPT]", 2);
  const [root, target] = args;
  const prompt = args.length === 3 ? args[2] : readFileSync(0, "utf8");

  // 1. The registry: port, host, this run's secret, and whether it proves itself.
  const path = join(root, ".bus-registry.json");
  let entry;
  try {
    entry = JSON.parse(readFileSync(path, "utf8")).instances?.[target];
  } catch (e) {
    fail(`cannot read ${path}: ${e.message}`, 75);
  }
  if (!entry) fail(`${target} is not registered in ${path} (is it running?)`, 75);
  const host = entry.host ?? "127.0.0.1";
  const { port, secret } = entry;
  const address = host.includes(":") ? `[${host}]:${port}` : `${host}:${port}`;

  // 2. Health on a new connection, with a nonce the instance must answer. One socket,
  // kept alive, so that the talk can go on the same one.
  const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
  const nonce = randomBytes(16).toString("hex");
  let health;
  try {
    health = await exchange(agent, {
      host, port, method: "GET", path: "/api/health",
      headers: { Host: address, "X-Loopbus-Nonce": nonce },
    }, undefined, PROBE_TIMEOUT_MS);
  } catch (e) {
    fail(`${target} at ${address} does not answer health: ${e.message}`, 75);
  }
  const h = health.json;
  if (health.status !== 200 || h.status !== "ok" || h.instance !== target) {
    fail(`${target} at ${address} is not alive (health: ${health.status})`, 75);
  }
  if (entry.proof !== true) {
    fail(`${target} cannot prove it holds its secret; this example only calls loopbus instances`, 1);
  }
  const message = `loopbus-proof-v1\n${target}\n${address}\n${nonce}`;
  const expected = Buffer.from(createHmac("sha256", secret).update(message).digest("hex"));
  const proof = Buffer.from(typeof h.proof === "string" ? h.proof : "");
  if (proof.length !== expected.length || !timingSafeEqual(proof, expected)) {
    fail(`whoever holds ${address} did not prove the secret of ${target}; not sending it`, 1);
  }

  // 3. The talk, on that same socket only. Content-Type must be application/json: the
  // form types are refused (415) because a browser may send them anywhere.
  const body = JSON.stringify({
    fromInstance: process.env.LOOPBUS_INSTANCE ?? "script",
    prompt,
    depth: Number.parseInt(process.env.LOOPBUS_DEPTH ?? "0", 10) + 1,
    protocolVersion: 1,
    capabilities: BASE_CAPABILITIES,
  });
  let talk;
  try {
    talk = await exchange(agent, {
      host, port, method: "POST", path: "/api/talk",
      headers: {
        Host: address,
        "Content-Type": "application/json",
        "Content-Length": Buffer.byteLength(body),
        Authorization: `Bearer ${secret}`,
      },
    }, body, TALK_TIMEOUT_MS, (socket) => {
      if (socket !== health.socket) throw new Error("the proved connection is gone; not sending the secret elsewhere");
    });
  } catch (e) {
    fail(`talk to ${target} failed: ${e.message}`, 75);
  } finally {
    agent.destroy();
  }

  // 4. The envelope: success and text, or errorCode and retryable.
  const envelope = talk.json;
  if (envelope.success === true) {
    const text = envelope.text ?? "";
    // Like `loopbus talk`: the reply ends with a newline, so a prompt never lands on it.
    process.stdout.write(text.endsWith("\n") ? text : text + "\n");
    return;
  }
  const code = envelope.errorCode ?? "unknown";
  fail(`${target}: ${envelope.error ?? ""} [${code}]`, envelope.retryable === true ? 75 : 1);
}

main();
