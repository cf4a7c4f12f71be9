// Reads POST /api/ai/chat with the AI SDK's own client code: the body its
// DefaultChatTransport sends, the answer parsed by the transport (the SDK's
// chunk schema; strict in ai 5.0.0, so an unknown key fails) and assembled by
// readUIMessageStream. Prints {"version", "text"}; exits 1 on any error.
//
//   node read_stream.mjs <chat url> <bearer token> <expected text>
import { DefaultChatTransport, readUIMessageStream } from 'ai';
import { createRequire } from 'node:module';

const [url, token, expected] = process.argv.slice(2);
const version = createRequire(import.meta.url)('ai/package.json').version;

try {
  const transport = new DefaultChatTransport({
    api: url,
    headers: { Authorization: `Bearer ${token}` },
  });
  const stream = await transport.sendMessages({
    trigger: 'submit-message',
    chatId: 'chat-1',
    messageId: undefined,
    messages: [{ id: 'm1', role: 'user', parts: [{ type: 'text', text: 'Hi' }] }],
    abortSignal: undefined,
  });
  let last;
  let failure;
  for await (const message of readUIMessageStream({
    stream,
    onError: (e) => { failure = e; },
    terminateOnError: true,
  })) {
    last = message;
  }
  if (failure) throw failure;
  const text = (last?.parts ?? [])
    .filter((p) => p.type === 'text')
    .map((p) => p.text)
    .join('');
  console.log(JSON.stringify({ version, text, role: last?.role }));
  if (text !== expected) {
    console.error(`expected text ${JSON.stringify(expected)}, got ${JSON.stringify(text)}`);
    process.exit(1);
  }
} catch (e) {
  console.error(`ai ${version}: ${e?.stack ?? e}`);
  process.exit(1);
}
