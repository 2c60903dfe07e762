// Scripted models for the adapters' tests, no network: for the AI SDK and Mastra, the AI SDK's
// own `MockLanguageModelV4` (`ai/test`) answering from a script, in both of its modes
// (Mastra's generate() calls doGenerate, its stream() doStream); for LangChain a
// `BaseChatModel`; for the OpenAI Agents SDK a `Model`.

import { BaseChatModel } from "@langchain/core/language_models/chat_models";
import { AIMessage, type BaseMessage } from "@langchain/core/messages";
import type { ChatResult } from "@langchain/core/outputs";
import type { StructuredToolInterface } from "@langchain/core/tools";
import { convertToOpenAITool } from "@langchain/core/utils/function_calling";
import { type Model, type ModelRequest, type ModelResponse, Usage } from "@openai/agents";
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

/** A chat model that answers from a script, then with every tool result it was shown, and
 * records the tools bound to it and the messages it was shown. */
export class ScriptedChatModel extends BaseChatModel {
  readonly script: AIMessage[];
  bound: ReturnType<typeof convertToOpenAITool>[] = [];
  seen: BaseMessage[][] = [];

  constructor(script: AIMessage[]) {
    super({});
    this.script = [...script];
  }

  _llmType(): string {
    return "scripted";
  }

  override bindTools(tools: StructuredToolInterface[]): this {
    this.bound = tools.map((t) => convertToOpenAITool(t));
    return this;
  }

  async _generate(messages: BaseMessage[]): Promise<ChatResult> {
    this.seen.push(messages);
    // Past the script: every tool result it was shown, joined by `---` lines.
    const shown = messages.filter((m) => m.type === "tool").map((m) => m.text);
    const message = this.script.shift() ?? new AIMessage(shown.join("\n---\n"));
    return { generations: [{ text: typeof message.content === "string" ? message.content : "", message }] };
  }
}

/** An AI message calling `tool` with `code`, as call number `n`. */
export function call(tool: string, code: string, n: number): AIMessage {
  return new AIMessage({ content: "", tool_calls: [{ name: tool, args: { code }, id: `call_${n}`, type: "tool_call" }] });
}

/** The function call outputs the model was given, in order. */
function toolOutputs(request: ModelRequest): string[] {
  const items = Array.isArray(request.input) ? request.input : [];
  return items.flatMap((item) => {
    if (item.type !== "function_call_result") return [];
    const output = item.output as unknown;
    if (typeof output === "string") return [output];
    // Structured output: its text items (images are read in the test that asks for them).
    const items = (Array.isArray(output) ? output : [output]) as { type: string; text?: unknown }[];
    return [items.filter((o) => o.type === "input_text" || o.type === "text").map((o) => String(o.text)).join("\n")];
  });
}

/** A model that calls `tool` with each of `codes` in turn, then answers with every output it
 * was shown, joined by `---` lines. */
export class ScriptedModel implements Model {
  readonly requests: ModelRequest[] = [];
  constructor(
    readonly tool: string,
    readonly codes: string[],
  ) {}

  async getResponse(request: ModelRequest): Promise<ModelResponse> {
    this.requests.push(request);
    const done = toolOutputs(request);
    const usage = new Usage();
    if (done.length < this.codes.length) {
      const code = this.codes[done.length] ?? "";
      return {
        usage,
        output: [{ type: "function_call", callId: `c${done.length}`, name: this.tool, arguments: JSON.stringify({ code }), status: "completed" }],
      };
    }
    const text = done.join("\n---\n");
    return {
      usage,
      output: [{ type: "message", role: "assistant", status: "completed", content: [{ type: "output_text", text }] }],
    };
  }

  getStreamedResponse(): AsyncIterable<never> {
    throw new Error("not streamed in these tests");
  }
}
