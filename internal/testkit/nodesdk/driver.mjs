// The driver the end-to-end tests run with Node: it reads a JSON list of
// calls on stdin, makes each call with the official SDK it names, and
// prints one JSON line per call. Each client counts the requests it sends
// through a wrapped fetch (its retries included).
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';
import { readFileSync } from 'node:fs';

const spec = JSON.parse(readFileSync(0, 'utf8'));

function countingFetch(stats, stripShouldRetry) {
  return async (url, init) => {
    stats.requests++;
    const resp = await fetch(url, init);
    stats.statuses.push(resp.status);
    if (!stripShouldRetry) return resp;
    // What a gateway without x-should-retry answered: the same response
    // without the header.
    const headers = new Headers(resp.headers);
    headers.delete('x-should-retry');
    return new Response(resp.body, { status: resp.status, statusText: resp.statusText, headers });
  };
}

async function oneCall(c) {
  const stats = { requests: 0, statuses: [] };
  const opts = {
    baseURL: c.baseURL,
    apiKey: 'sk-node-client',
    defaultHeaders: c.headers || {},
    fetch: countingFetch(stats, c.stripShouldRetry),
  };
  if (c.timeoutMs) opts.timeout = c.timeoutMs;
  // Per-request options (the second argument of create).
  const reqOpts = {};
  if (c.idempotencyKey) reqOpts.idempotencyKey = c.idempotencyKey;
  if (c.requestHeaders) reqOpts.headers = c.requestHeaders;
  if (c.maxRetries !== undefined && c.maxRetries !== null) opts.maxRetries = c.maxRetries;
  const t0 = performance.now();
  let firstMs = null;
  let text = '';
  let error = null;
  const got = (delta) => {
    if (!delta) return;
    if (firstMs === null) firstMs = performance.now() - t0;
    text += delta;
  };
  try {
    if (c.api === 'chat') {
      const client = new OpenAI(opts);
      const stream = await client.chat.completions.create({
        model: 'client-model', stream: true, messages: [{ role: 'user', content: 'Say something.' }],
      }, reqOpts);
      for await (const chunk of stream) {
        for (const choice of chunk.choices || []) got(choice.delta && choice.delta.content);
      }
    } else if (c.api === 'responses') {
      const client = new OpenAI(opts);
      // The SDK's default call: no "store" field.
      const stream = client.responses.stream({ model: 'client-model', input: 'Say something.' });
      for await (const ev of stream) {
        if (ev.type === 'response.output_text.delta') got(ev.delta);
      }
    } else if (c.api === 'messages') {
      const client = new Anthropic(opts);
      const stream = await client.messages.create({
        model: 'client-model', max_tokens: 64, stream: true, messages: [{ role: 'user', content: 'Say something.' }],
      }, reqOpts);
      for await (const ev of stream) {
        if (ev.type === 'content_block_delta' && ev.delta && ev.delta.type === 'text_delta') got(ev.delta.text);
      }
    } else {
      throw new Error('unknown api ' + c.api);
    }
  } catch (e) {
    error = { name: e && e.constructor ? e.constructor.name : 'Error', status: e && e.status ? e.status : 0, message: String(e && e.message).slice(0, 300) };
  }
  return { requests: stats.requests, statuses: stats.statuses, ms: performance.now() - t0, firstMs, text, error };
}

const calls = spec.calls || [];
const concurrency = spec.concurrency || 1;
const results = new Array(calls.length);
let next = 0;
async function worker() {
  while (next < calls.length) {
    const i = next++;
    results[i] = await oneCall(calls[i]);
  }
}
await Promise.all(Array.from({ length: concurrency }, worker));
for (const r of results) process.stdout.write(JSON.stringify(r) + '\n');
