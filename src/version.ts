import { createRequire } from "node:module";

const pkg = createRequire(import.meta.url)("../package.json") as { name: string; version: string };

/** The tool's name and version as recorded in every manifest. */
export const TOOL_NAME: string = pkg.name;
export const TOOL_VERSION: string = pkg.version;
