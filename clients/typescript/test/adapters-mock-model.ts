// A scripted model for the AI SDK and Mastra tests: the AI SDK's own `MockLanguageModelV4`
// (`ai/test`) answering from a script, in both of its modes (Mastra's generate() calls
// doGenerate, its stream() doStream).

import { MockLanguageModelV4, convertArrayToReadableStream } from "ai/test";

type Prompt = { role: string; content: unknown }[];

/** A tool result the model was shown. */
export interface Shown {
  readonly id: string;
  readonly output: { readonly type: string; readonly value: unknown };
}

/** The tool results in a prompt, in order. */
export function toolResults(prompt: unknown): Shown[] {
  return (prompt as Prompt)
    .filter((m) => m.role === "tool")
    .flatMap((m) => m.content as { type: string; toolCallId: string; output: Shown["output"] }[])
    .filter((p) => p.type === "tool-result")
    .map((p) => ({ id: p.toolCallId, output: p.output }));
}

const usage = {
  inputTokens: { total: 1, noCache: 1, cacheRead: undefined, cacheWrite: undefined },
  outputTokens: { total: 1, text: 1, reasoning: undefined },
};

/** A model that calls `tool` with each of `codes` in turn, then answers with every result it
 * was shown, joined by `---` lines. */
export function scripted(tool: string, codes: string[]): MockLanguageModelV4 {
  // What the model says next: a tool call, or the final text.
  const next = (prompt: unknown): { call: { toolCallId: string; toolName: string; input: string } } | { text: string } => {
    const done = toolResults(prompt);
    const code = codes[done.length];
    if (code !== undefined) return { call: { toolCallId: `c${done.length}`, toolName: tool, input: JSON.stringify({ code }) } };
    return { text: done.map((r) => (typeof r.output.value === "string" ? r.output.value : JSON.stringify(r.output.value))).join("\n---\n") };
  };
  return new MockLanguageModelV4({
    doGenerate: async ({ prompt }) => {
      const step = next(prompt);
      return "call" in step
        ? { content: [{ type: "tool-call", ...step.call }], finishReason: { unified: "tool-calls", raw: undefined }, usage, warnings: [] }
        : { content: [{ type: "text", text: step.text }], finishReason: { unified: "stop", raw: undefined }, usage, warnings: [] };
    },
    doStream: async ({ prompt }) => {
      const step = next(prompt);
      const parts =
        "call" in step
          ? [{ type: "tool-call", ...step.call }, { type: "finish", finishReason: { unified: "tool-calls", raw: undefined }, usage }]
          : [
              { type: "text-start", id: "t" },
              { type: "text-delta", id: "t", delta: step.text },
              { type: "text-end", id: "t" },
              { type: "finish", finishReason: { unified: "stop", raw: undefined }, usage },
            ];
      return { stream: convertArrayToReadableStream([{ type: "stream-start", warnings: [] }, ...parts] as never[]) };
    },
  });
}
