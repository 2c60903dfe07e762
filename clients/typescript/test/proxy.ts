// A TCP proxy in front of the test server that can cut a connection in the middle of an
// answer (a proxy or a network that drops it), and a server that answers as a proxy's error
// page does: what a client meets between itself and airlock.

import { createServer as createHttpServer } from "node:http";
import { connect, createServer, type Server as NetServer, type Socket } from "node:net";

/** A running helper server: its URL and how to stop it. */
export interface Helper {
  url: string;
  close(): Promise<void>;
}

/** Forwards every connection to `target` (`http://host:port`); once an answer holds `cutAt`,
 * both sides of its connection are destroyed at once. */
export async function cuttingProxy(target: string, cutAt: string): Promise<Helper> {
  const { hostname, port } = new URL(target);
  const sockets = new Set<Socket>();
  const server: NetServer = createServer((client) => {
    const upstream = connect(Number(port), hostname);
    sockets.add(client).add(upstream);
    let seen = "";
    client.pipe(upstream);
    upstream.on("data", (chunk: Buffer) => {
      client.write(chunk);
      seen += chunk.toString("latin1");
      if (seen.includes(cutAt)) {
        client.destroy();
        upstream.destroy();
      }
    });
    const end = (): void => {
      client.destroy();
      upstream.destroy();
    };
    upstream.on("close", end).on("error", end);
    client.on("close", end).on("error", end);
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const address = server.address();
  if (address === null || typeof address === "string") throw new Error("no address");
  return {
    url: `http://127.0.0.1:${address.port}`,
    close: () =>
      new Promise((resolve) => {
        for (const s of sockets) s.destroy();
        server.close(() => resolve());
      }),
  };
}

/** Answers every request with `status` and an HTML page, as a proxy whose upstream is down
 * does. */
export async function htmlErrorPage(status: number): Promise<Helper> {
  const server = createHttpServer((_req, res) => {
    res.writeHead(status, { "Content-Type": "text/html" });
    res.end("<html><body><h1>502 Bad Gateway</h1>\u001b[31m</body></html>");
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const address = server.address();
  if (address === null || typeof address === "string") throw new Error("no address");
  return {
    url: `http://127.0.0.1:${address.port}`,
    close: () =>
      new Promise((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}
